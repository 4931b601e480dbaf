//go:build !purego

#include "textflag.h"

// Folding constants for CRC-32C (Castagnoli), bit-reflected, from
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" (Intel,
// 2009) as laid out by Linux's crc32-pclmul and Go's hash/crc32: for a
// fold over d bits, the low quadword is (x^(d+32) mod P)' << 1 and the
// high one (x^(d-32) mod P)' << 1. crc_test.go recomputes them.
DATA k2048<>+0(SB)/8, $0xdcb17aa4
DATA k2048<>+8(SB)/8, $0xb9e02b86
DATA k2048<>+16(SB)/8, $0xdcb17aa4
DATA k2048<>+24(SB)/8, $0xb9e02b86
DATA k2048<>+32(SB)/8, $0xdcb17aa4
DATA k2048<>+40(SB)/8, $0xb9e02b86
DATA k2048<>+48(SB)/8, $0xdcb17aa4
DATA k2048<>+56(SB)/8, $0xb9e02b86
GLOBL k2048<>(SB), RODATA, $64

DATA k512<>+0(SB)/8, $0x740eef02
DATA k512<>+8(SB)/8, $0x9e4addf8
DATA k512<>+16(SB)/8, $0x740eef02
DATA k512<>+24(SB)/8, $0x9e4addf8
DATA k512<>+32(SB)/8, $0x740eef02
DATA k512<>+40(SB)/8, $0x9e4addf8
DATA k512<>+48(SB)/8, $0x740eef02
DATA k512<>+56(SB)/8, $0x9e4addf8
GLOBL k512<>(SB), RODATA, $64

DATA k128<>+0(SB)/8, $0xf20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA, $16

DATA k64<>+0(SB)/8, $0xdd45aab8
GLOBL k64<>(SB), RODATA, $8

// P' (reflected polynomial) and mu' (reflected floor(x^64 / P)) for the
// final Barrett reduction.
DATA kpoly<>+0(SB)/8, $0x105ec76f1
DATA kpoly<>+8(SB)/8, $0xdea713f1
GLOBL kpoly<>(SB), RODATA, $16

// LOAD4 loads the next 256 bytes at SI into Z11-Z14, STORE4 stores them
// at DI, FOLD4 folds the accumulators Z1-Z4 (2048 bits apart) over them.
// CRC3 runs the CRC32 instruction over a quadword of each of the three
// streams at R9, R9+R10 and R9+2*R10 into R12, R13 and BX.
#define LOAD4 \
	VMOVDQU64 (SI), Z11; \
	VMOVDQU64 64(SI), Z12; \
	VMOVDQU64 128(SI), Z13; \
	VMOVDQU64 192(SI), Z14

#define FOLD4 \
	VPCLMULQDQ $0x11, Z0, Z1, Z5; \
	VPCLMULQDQ $0x11, Z0, Z2, Z6; \
	VPCLMULQDQ $0x11, Z0, Z3, Z7; \
	VPCLMULQDQ $0x11, Z0, Z4, Z8; \
	VPCLMULQDQ $0x00, Z0, Z1, Z1; \
	VPCLMULQDQ $0x00, Z0, Z2, Z2; \
	VPCLMULQDQ $0x00, Z0, Z3, Z3; \
	VPCLMULQDQ $0x00, Z0, Z4, Z4; \
	VPTERNLOGD $0x96, Z11, Z5, Z1; \
	VPTERNLOGD $0x96, Z12, Z6, Z2; \
	VPTERNLOGD $0x96, Z13, Z7, Z3; \
	VPTERNLOGD $0x96, Z14, Z8, Z4

#define STORE4 \
	VMOVDQU64 Z11, (DI); \
	VMOVDQU64 Z12, 64(DI); \
	VMOVDQU64 Z13, 128(DI); \
	VMOVDQU64 Z14, 192(DI)

#define STORE4NT \
	VMOVNTDQ Z11, (DI); \
	VMOVNTDQ Z12, 64(DI); \
	VMOVNTDQ Z13, 128(DI); \
	VMOVNTDQ Z14, 192(DI)

#define CRC3(off) \
	CRC32Q off(R9), R12; \
	CRC32Q off(R9)(R10*1), R13; \
	CRC32Q off(R9)(R10*2), BX

// SCALAR does 40 bytes of each stream (see hybridBlock in crc.go).
#define SCALAR CRC3(0); CRC3(8); CRC3(16); CRC3(24); CRC3(32)

// SHIFT sets reg to reg * x^(8L) mod P, for x^(8L-33) mod P in X7 (the
// reflected product of two 32-bit values is one bit short, and CRC32Q
// multiplies its operand by x^32). Clobbers X6 and R8.
#define SHIFT(reg) \
	MOVQ      reg, X6; \
	PCLMULQDQ $0, X7, X6; \
	MOVQ      X6, R8; \
	XORL      reg, reg; \
	CRC32Q    R8, reg

// FOLD512 folds Z1 into z, 512 bits further on (constants in Z0), leaving
// the sum in Z1; FOLD128 does the same for X1 and x, 128 bits apart.
#define FOLD512(z) \
	VPCLMULQDQ $0x11, Z0, Z1, Z5; \
	VPCLMULQDQ $0x00, Z0, Z1, Z1; \
	VPTERNLOGD $0x96, z, Z5, Z1

#define FOLD128(x) \
	MOVOA     X1, X5; \
	PCLMULQDQ $0, X0, X1; \
	PCLMULQDQ $0x11, X0, X5; \
	PXOR      X5, X1; \
	PXOR      x, X1

// REDUCE reduces the accumulators Z1-Z4 to the CRC, left in bits 32-63 of
// X1: Z1 is folded into Z2, Z3 and Z4 (512 bits apart), the four 128-bit
// lanes of the remainder into X1 (as hash/crc32's ieeeCLMUL), 128 bits to
// 64, and a Barrett reduction to 32. Clobbers X0-X5.
#define REDUCE \
	VMOVDQU64 k512<>(SB), Z0; \
	FOLD512(Z2); \
	FOLD512(Z3); \
	FOLD512(Z4); \
	VEXTRACTI32X4 $1, Z1, X2; \
	VEXTRACTI32X4 $2, Z1, X3; \
	VEXTRACTI32X4 $3, Z1, X4; \
	VZEROUPPER; \
	MOVOU     k128<>(SB), X0; \
	FOLD128(X2); \
	FOLD128(X3); \
	FOLD128(X4); \
	PCMPEQB   X3, X3; \
	PCLMULQDQ $1, X1, X0; \
	PSRLDQ    $8, X1; \
	PXOR      X0, X1; \
	MOVOA     X1, X2; \
	MOVQ      k64<>(SB), X0; \
	PSRLQ     $32, X3; \
	PSRLDQ    $4, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1; \
	MOVOU     kpoly<>(SB), X0; \
	MOVOA     X1, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0x10, X0, X1; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1

// func crc32cFold(dst, src *byte, n int, crc uint32, mode int) uint32
//
// crc32cFold updates the raw (not inverted) CRC-32C state crc with the n
// bytes at src, n a positive multiple of 256, and copies them to dst:
// with non-temporal stores in mode foldCopyNT (dst must be 64-byte
// aligned), normal ones in mode foldCopy. It needs AVX-512F and
// VPCLMULQDQ.
TEXT ·crc32cFold(SB), NOSPLIT, $0-44
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL crc+24(FP), AX
	MOVQ mode+32(FP), DX

	LOAD4
	VMOVDQU64 Z11, Z1
	VMOVDQU64 Z12, Z2
	VMOVDQU64 Z13, Z3
	VMOVDQU64 Z14, Z4
	CMPQ DX, $1
	JA   firstnt
	STORE4
	JMP  first
firstnt:
	STORE4NT

first:
	VMOVD  AX, X10
	VPXORQ Z10, Z1, Z1
	ADDQ   $256, SI
	ADDQ   $256, DI
	SUBQ   $256, CX
	JZ     reduce
	VMOVDQU64 k2048<>(SB), Z0
	CMPQ   DX, $1
	JA     ntloop

copyloop:
	LOAD4
	STORE4
	FOLD4
	ADDQ $256, SI
	ADDQ $256, DI
	SUBQ $256, CX
	JNZ  copyloop
	JMP  reduce

ntloop:
	LOAD4
	STORE4NT
	FOLD4
	ADDQ $256, SI
	ADDQ $256, DI
	SUBQ $256, CX
	JNZ  ntloop

reduce:
	SFENCE // order the non-temporal stores, if any, before our return
	REDUCE
	PEXTRD $1, X1, AX
	MOVL   AX, ret+40(FP)
	RET

// func crc32cHybrid(src *byte, blocks int, crc uint32) uint32
//
// crc32cHybrid updates the raw (not inverted) CRC-32C state crc with the
// n = blocks*376 bytes at src, blocks > 0. The bytes are four regions: the
// first blocks*256 are folded with VPCLMULQDQ into four 512-bit
// accumulators, and each of the three others, of L = blocks*40 bytes,
// goes through a chain of CRC32 instructions; every iteration does 256
// bytes of the first and 40 of each stream, so the vector and the integer
// units work side by side. At the end the four CRCs are joined as
// ((cV x^8L + cA) x^8L + cB) x^8L + cC mod P, with x^8L mod P computed in
// log(L) steps. It needs AVX-512F, VPCLMULQDQ and SSE4.2.
TEXT ·crc32cHybrid(SB), NOSPLIT, $0-28
	MOVQ   src+0(FP), SI
	MOVQ   blocks+8(FP), CX
	MOVL   crc+16(FP), AX
	MOVQ   CX, R10
	SHLQ   $8, R10
	LEAQ   (SI)(R10*1), R9 // the streams
	IMUL3Q $40, CX, R10    // L
	XORL   R12, R12
	XORL   R13, R13
	XORL   BX, BX

	LOAD4
	VMOVDQU64 Z11, Z1
	VMOVDQU64 Z12, Z2
	VMOVDQU64 Z13, Z3
	VMOVDQU64 Z14, Z4
	SCALAR
	VMOVD     AX, X10
	VPXORQ    Z10, Z1, Z1
	ADDQ      $256, SI
	ADDQ      $40, R9
	DECQ      CX
	JZ        hreduce
	VMOVDQU64 k2048<>(SB), Z0

hloop:
	LOAD4
	FOLD4
	SCALAR
	ADDQ $256, SI
	ADDQ $40, R9
	DECQ CX
	JNZ  hloop

hreduce:
	REDUCE
	PEXTRD $1, X1, SI // cV

	// x^(8L-33) mod P into X7, by Peter Cawley's xnmodp ("Faster
	// CRC32-C on x86"): the exponent is halved (less 16, as each
	// squaring step below also multiplies by x^32) down to at most 191,
	// its low bits pushed on a bit stack in DX; the power for the last
	// exponent is a bit shifted into place and carried by CRC32 steps
	// over zero words (x^32 each); then for each bit popped, the value
	// is squared (PCLMULQDQ), multiplied by x if the bit is set, and
	// reduced (CRC32Q).
	LEAQ -33(R10*8), CX
	MOVQ $-2, DX
halve:
	CMPQ CX, $191
	JBE  halved
	MOVQ CX, R8
	ANDQ $1, R8
	SHLQ $1, DX
	ADDQ R8, DX
	SHRQ $1, CX
	SUBQ $16, CX
	JMP  halve
halved:
	NOTQ DX
	MOVQ CX, R8
	ANDQ $31, CX
	MOVL $0x80000000, AX
	SHRL CX, AX
	SHRQ $5, R8
	XORL R9, R9
zeros:
	TESTQ  R8, R8
	JZ     square
	CRC32L R9, AX
	DECQ   R8
	JMP    zeros
square:
	MOVQ DX, CX
	ANDQ $1, CX
	SHRQ $1, DX
	JZ   join
	MOVQ      AX, X6
	PCLMULQDQ $0, X6, X6
	MOVQ      X6, R8
	SHLQ      CX, R8
	XORL      AX, AX
	CRC32Q    R8, AX
	JMP       square

join:
	MOVQ  AX, X7
	SHIFT(SI)
	XORL  R12, SI
	SHIFT(SI)
	XORL  R13, SI
	SHIFT(SI)
	XORL  BX, SI
	MOVL  SI, ret+24(FP)
	RET
