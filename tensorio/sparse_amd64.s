//go:build !purego

#include "textflag.h"

// packIdx gathers bytes 0-2 of 16 dwords into 48 bytes; unpackIdx
// spreads 48 bytes back into bytes 0-2 of 16 dwords.
DATA packIdx<>+0(SB)/8, $0x0908060504020100
DATA packIdx<>+8(SB)/8, $0x141211100e0d0c0a
DATA packIdx<>+16(SB)/8, $0x1e1d1c1a19181615
DATA packIdx<>+24(SB)/8, $0x2928262524222120
DATA packIdx<>+32(SB)/8, $0x343231302e2d2c2a
DATA packIdx<>+40(SB)/8, $0x3e3d3c3a39383635
DATA packIdx<>+48(SB)/8, $0x0000000000000000
DATA packIdx<>+56(SB)/8, $0x0000000000000000
GLOBL packIdx<>(SB), RODATA, $64

DATA unpackIdx<>+0(SB)/8, $0x0005040300020100
DATA unpackIdx<>+8(SB)/8, $0x000b0a0900080706
DATA unpackIdx<>+16(SB)/8, $0x0011100f000e0d0c
DATA unpackIdx<>+24(SB)/8, $0x0017161500141312
DATA unpackIdx<>+32(SB)/8, $0x001d1c1b001a1918
DATA unpackIdx<>+40(SB)/8, $0x0023222100201f1e
DATA unpackIdx<>+48(SB)/8, $0x0029282700262524
DATA unpackIdx<>+56(SB)/8, $0x002f2e2d002c2b2a
GLOBL unpackIdx<>(SB), RODATA, $64

// The sparse kernels work on blocks of 64 elements (one bitmap word) in
// groups of 16 (one ZMM register, 16 bits of bitmap): VPTESTMD finds the
// non-zero elements, VPCOMPRESSD packs them and VPEXPANDD puts them back.
// Every store is a whole register; the Go callers (sparse.go, huff.go)
// give the room it needs past the last packed value.

// func sparseEncodeAVX(bm, vals *byte, src *float32, blocks int) (valBytes int)
//
// sparseEncodeAVX writes the bitmap and the packed non-zero values of
// 64*blocks elements and returns the bytes of values written. It stores
// 64 bytes at each group's output position, which is at most 4 x the
// elements before the group.
TEXT ·sparseEncodeAVX(SB), NOSPLIT, $0-40
	MOVQ bm+0(FP), R8
	MOVQ vals+8(FP), DI
	MOVQ src+16(FP), SI
	MOVQ blocks+24(FP), CX
	MOVQ DI, R9
	SHLQ $2, CX              // 16-element groups
	JZ   encdone
encloop:
	VMOVDQU32   (SI), Z1
	VPTESTMD    Z1, Z1, K1
	VPCOMPRESSD Z1, K1, Z2
	VMOVDQU32   Z2, (DI)
	KMOVW       K1, AX
	MOVW        AX, (R8)
	POPCNTL     AX, AX
	LEAQ        (DI)(AX*4), DI
	ADDQ        $64, SI
	ADDQ        $2, R8
	DECQ        CX
	JNZ         encloop
encdone:
	SUBQ R9, DI
	MOVQ DI, valBytes+32(FP)
	VZEROUPPER
	RET

// func sparseDecodeAVX(dst *float32, bm, vals *byte, blocks, valsLen int) (done, valBytes int)
//
// sparseDecodeAVX expands up to blocks blocks, stopping before one whose
// loads (64 bytes per group, 256 in all) could pass vals[valsLen], and
// returns the blocks done and the bytes of values used.
TEXT ·sparseDecodeAVX(SB), NOSPLIT, $0-56
	MOVQ dst+0(FP), DI
	MOVQ bm+8(FP), R8
	MOVQ vals+16(FP), SI
	MOVQ blocks+24(FP), CX
	MOVQ valsLen+32(FP), R10
	ADDQ SI, R10             // end of vals
	SUBQ $256, R10           // last start for a full block
	MOVQ SI, R9
	XORQ R11, R11            // blocks done
decloop:
	CMPQ R11, CX
	JAE  decdone
	CMPQ SI, R10
	JA   decdone
	MOVQ $4, DX
decgroup:
	MOVWLZX      (R8), AX
	KMOVW        AX, K1
	VMOVDQU32    (SI), Z1
	VPEXPANDD.Z  Z1, K1, Z2
	VMOVDQU32    Z2, (DI)
	POPCNTL      AX, AX
	LEAQ         (SI)(AX*4), SI
	ADDQ         $64, DI
	ADDQ         $2, R8
	DECQ         DX
	JNZ          decgroup
	INCQ R11
	JMP  decloop
decdone:
	MOVQ R11, done+40(FP)
	SUBQ R9, SI
	MOVQ SI, valBytes+48(FP)
	VZEROUPPER
	RET

// func sparseSplitAVX(bm, top, low *byte, src *float32, blocks int) (nnz int)
//
// sparseSplitAVX is sparseSplit on whole blocks: bitmap, top byte of each
// non-zero element, low three bytes. Per group it stores 16 top bytes and
// 64 low bytes: top needs room for the elements, low for 3 x the elements
// plus 16 bytes.
TEXT ·sparseSplitAVX(SB), NOSPLIT, $0-48
	MOVQ bm+0(FP), R8
	MOVQ top+8(FP), DI
	MOVQ low+16(FP), DX
	MOVQ src+24(FP), SI
	MOVQ blocks+32(FP), CX
	MOVQ DI, R9
	VMOVDQU64 packIdx<>(SB), Z7
	SHLQ $2, CX
	JZ   splitdone
splitloop:
	VMOVDQU32   (SI), Z1
	VPTESTMD    Z1, Z1, K1
	VPCOMPRESSD.Z Z1, K1, Z2
	VPSRLD      $24, Z2, Z3
	VPMOVDB     Z3, X3
	VMOVDQU     X3, (DI)
	VPERMB      Z2, Z7, Z4
	VMOVDQU8    Z4, (DX)
	KMOVW       K1, AX
	MOVW        AX, (R8)
	POPCNTL     AX, AX
	ADDQ        AX, DI
	LEAQ        (DX)(AX*2), DX
	ADDQ        AX, DX
	ADDQ        $64, SI
	ADDQ        $2, R8
	DECQ        CX
	JNZ         splitloop
splitdone:
	SUBQ R9, DI
	MOVQ DI, nnz+40(FP)
	VZEROUPPER
	RET

// func sparseJoinAVX(dst *float32, bm, top, low *byte, blocks, topLen, lowLen int) (done, k int)
//
// sparseJoinAVX inverts sparseSplitAVX on up to blocks blocks, stopping
// before one whose loads (16 top and 64 low bytes per group) could pass
// top[topLen] or low[lowLen]; it returns the blocks done and the non-zero
// elements used.
TEXT ·sparseJoinAVX(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ bm+8(FP), R8
	MOVQ top+16(FP), SI
	MOVQ low+24(FP), DX
	MOVQ blocks+32(FP), CX
	MOVQ topLen+40(FP), R10
	ADDQ SI, R10
	SUBQ $64, R10            // top: a block reads at most 48+16 bytes
	MOVQ lowLen+48(FP), R12
	ADDQ DX, R12
	SUBQ $208, R12           // low: a block reads at most 3*48+64 bytes
	MOVQ SI, R9
	XORQ R11, R11
	VMOVDQU64 unpackIdx<>(SB), Z7
	MOVQ $0x7777777777777777, AX
	KMOVQ AX, K2
joinloop:
	CMPQ R11, CX
	JAE  joindone
	CMPQ SI, R10
	JA   joindone
	CMPQ DX, R12
	JA   joindone
	MOVQ $4, BX
joingroup:
	MOVWLZX      (R8), AX
	KMOVW        AX, K1
	VPMOVZXBD    (SI), Z1
	VPSLLD       $24, Z1, Z1
	VMOVDQU8     (DX), Z2
	VPERMB.Z     Z2, Z7, K2, Z3
	VPORD        Z1, Z3, Z3
	VPEXPANDD.Z  Z3, K1, Z4
	VMOVDQU32    Z4, (DI)
	POPCNTL      AX, AX
	ADDQ         AX, SI
	LEAQ         (DX)(AX*2), DX
	ADDQ         AX, DX
	ADDQ         $64, DI
	ADDQ         $2, R8
	DECQ         BX
	JNZ          joingroup
	INCQ R11
	JMP  joinloop
joindone:
	MOVQ R11, done+56(FP)
	SUBQ R9, SI
	MOVQ SI, k+64(FP)
	VZEROUPPER
	RET
