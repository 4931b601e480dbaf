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

// func crc32cFold(dst, src *byte, n int, crc uint32, mode int) uint32
//
// crc32cFold updates the raw (not inverted) CRC-32C state crc with the n
// bytes at src, n a positive multiple of 256. Mode foldCopy also copies
// them to dst, foldCopyNT copies them with non-temporal stores (dst must
// be 64-byte aligned), foldHash does not copy. It needs AVX-512F and
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
	JB   first
	JA   firstnt
	STORE4
	JMP  firstdone
firstnt:
	STORE4NT
firstdone:
	ADDQ $256, DI

first:
	VMOVD  AX, X10
	VPXORQ Z10, Z1, Z1
	ADDQ   $256, SI
	SUBQ   $256, CX
	JZ     reduce
	VMOVDQU64 k2048<>(SB), Z0
	CMPQ   DX, $1
	JB     hashloop
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
	JMP  reduce

hashloop:
	LOAD4
	FOLD4
	ADDQ $256, SI
	SUBQ $256, CX
	JNZ  hashloop

reduce:
	SFENCE // order the non-temporal stores, if any, before our return
	// Fold Z1 into Z2, Z3 and Z4 (512 bits apart), leaving one
	// 512-bit remainder in Z1.
	VMOVDQU64 k512<>(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z2, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z3, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z4, Z5, Z1

	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VZEROUPPER

	// Fold the four 128-bit lanes into X1 (as hash/crc32's ieeeCLMUL).
	MOVOU     k128<>(SB), X0
	MOVOA     X1, X5
	PCLMULQDQ $0, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X2, X1
	MOVOA     X1, X5
	PCLMULQDQ $0, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X3, X1
	MOVOA     X1, X5
	PCLMULQDQ $0, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X4, X1

	// 128 -> 64 bits, then Barrett reduction to 32.
	PCMPEQB   X3, X3
	PCLMULQDQ $1, X1, X0
	PSRLDQ    $8, X1
	PXOR      X0, X1
	MOVOA     X1, X2
	MOVQ      k64<>(SB), X0
	PSRLQ     $32, X3
	PSRLDQ    $4, X2
	PAND      X3, X1
	PCLMULQDQ $0, X0, X1
	PXOR      X2, X1
	MOVOU     kpoly<>(SB), X0
	MOVOA     X1, X2
	PAND      X3, X1
	PCLMULQDQ $0x10, X0, X1
	PAND      X3, X1
	PCLMULQDQ $0, X0, X1
	PXOR      X2, X1
	PEXTRD    $1, X1, AX
	MOVL      AX, ret+40(FP)
	RET
