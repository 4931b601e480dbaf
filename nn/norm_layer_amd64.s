//go:build !purego

#include "textflag.h"

// LayerNorm's loops (norm_layer.go), eight values at a time, with the same
// operations in the same order for each value (no FMA; the column sums
// add rows in ascending order, a column a lane), so that they give the
// loops' bits. Go's operand order is the reverse of Intel's: VSUBPD a, b,
// c is c = b − a.

// func lnNormAVX2(x, xh, y *float32, n int, mean, inv float64, w, b *float32)
TEXT ·lnNormAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ xh+8(FP), DI
	MOVQ y+16(FP), DX
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	VBROADCASTSD mean+32(FP), Y14
	VBROADCASTSD inv+40(FP), Y15
	MOVQ w+48(FP), R8
	MOVQ b+56(FP), R10
	XORQ AX, AX
	TESTQ R8, R8
	JZ normplain

normaffine:
	VCVTPS2PD (SI)(AX*1), Y0
	VCVTPS2PD 16(SI)(AX*1), Y1
	VSUBPD Y14, Y0, Y0
	VSUBPD Y14, Y1, Y1
	VMULPD Y15, Y0, Y0
	VMULPD Y15, Y1, Y1
	VCVTPD2PSY Y0, X0
	VCVTPD2PSY Y1, X1
	VINSERTF128 $1, X1, Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	VMULPS (R8)(AX*1), Y0, Y0
	VADDPS (R10)(AX*1), Y0, Y0
	VMOVUPS Y0, (DX)(AX*1)
	ADDQ $32, AX
	CMPQ AX, CX
	JLT normaffine
	VZEROUPPER
	RET

normplain:
	VCVTPS2PD (SI)(AX*1), Y0
	VCVTPS2PD 16(SI)(AX*1), Y1
	VSUBPD Y14, Y0, Y0
	VSUBPD Y14, Y1, Y1
	VMULPD Y15, Y0, Y0
	VMULPD Y15, Y1, Y1
	VCVTPD2PSY Y0, X0
	VCVTPD2PSY Y1, X1
	VINSERTF128 $1, X1, Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	CMPQ AX, CX
	JLT normplain
	VZEROUPPER
	RET

// func lnGradAVX2(dy, xh, dx *float32, n int, w *float32, a, b, inv float64)
TEXT ·lnGradAVX2(SB), NOSPLIT, $0-64
	MOVQ dy+0(FP), SI
	MOVQ xh+8(FP), DI
	MOVQ dx+16(FP), DX
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	MOVQ w+32(FP), R8
	VBROADCASTSD a+40(FP), Y13
	VBROADCASTSD b+48(FP), Y14
	VBROADCASTSD inv+56(FP), Y15
	XORQ AX, AX

gradloop:
	VMOVUPS (SI)(AX*1), Y0
	TESTQ R8, R8
	JZ gradnow
	VMULPS (R8)(AX*1), Y0, Y0

gradnow:
	VEXTRACTF128 $1, Y0, X2
	VCVTPS2PD X0, Y1
	VCVTPS2PD X2, Y2
	VSUBPD Y13, Y1, Y1
	VSUBPD Y13, Y2, Y2
	VCVTPS2PD (DI)(AX*1), Y3
	VCVTPS2PD 16(DI)(AX*1), Y4
	VMULPD Y14, Y3, Y3
	VMULPD Y14, Y4, Y4
	VSUBPD Y3, Y1, Y1
	VSUBPD Y4, Y2, Y2
	VMULPD Y15, Y1, Y1
	VMULPD Y15, Y2, Y2
	VCVTPD2PSY Y1, X1
	VCVTPD2PSY Y2, X2
	VINSERTF128 $1, X2, Y1, Y1
	VMOVUPS Y1, (DX)(AX*1)
	ADDQ $32, AX
	CMPQ AX, CX
	JLT gradloop
	VZEROUPPER
	RET

// func lnColSumsAVX2(dy, xh *float32, rows, stride, n int, dw, db *float32)
//
// Columns go in blocks of 32 (then 8) whose sums stay in registers while
// the block's rows stream past.
TEXT ·lnColSumsAVX2(SB), NOSPLIT, $0-56
	MOVQ dy+0(FP), SI
	MOVQ xh+8(FP), DI
	MOVQ rows+16(FP), BX
	MOVQ stride+24(FP), R11
	SHLQ $2, R11
	MOVQ n+32(FP), CX
	SHLQ $2, CX
	MOVQ dw+40(FP), R8
	MOVQ db+48(FP), R10
	XORQ AX, AX // column offset in bytes

colblock32:
	MOVQ CX, DX
	SUBQ AX, DX
	CMPQ DX, $128
	JLT colblock8
	VMOVUPS (R8)(AX*1), Y0
	VMOVUPS 32(R8)(AX*1), Y1
	VMOVUPS 64(R8)(AX*1), Y2
	VMOVUPS 96(R8)(AX*1), Y3
	VMOVUPS (R10)(AX*1), Y4
	VMOVUPS 32(R10)(AX*1), Y5
	VMOVUPS 64(R10)(AX*1), Y6
	VMOVUPS 96(R10)(AX*1), Y7
	LEAQ (SI)(AX*1), R12
	LEAQ (DI)(AX*1), R13
	MOVQ BX, R9

row32:
	VMOVUPS (R12), Y8
	VMOVUPS 32(R12), Y9
	VMOVUPS 64(R12), Y10
	VMOVUPS 96(R12), Y11
	VMULPS (R13), Y8, Y12
	VADDPS Y12, Y0, Y0
	VMULPS 32(R13), Y9, Y12
	VADDPS Y12, Y1, Y1
	VMULPS 64(R13), Y10, Y12
	VADDPS Y12, Y2, Y2
	VMULPS 96(R13), Y11, Y12
	VADDPS Y12, Y3, Y3
	VADDPS Y8, Y4, Y4
	VADDPS Y9, Y5, Y5
	VADDPS Y10, Y6, Y6
	VADDPS Y11, Y7, Y7
	ADDQ R11, R12
	ADDQ R11, R13
	DECQ R9
	JNZ row32
	VMOVUPS Y0, (R8)(AX*1)
	VMOVUPS Y1, 32(R8)(AX*1)
	VMOVUPS Y2, 64(R8)(AX*1)
	VMOVUPS Y3, 96(R8)(AX*1)
	VMOVUPS Y4, (R10)(AX*1)
	VMOVUPS Y5, 32(R10)(AX*1)
	VMOVUPS Y6, 64(R10)(AX*1)
	VMOVUPS Y7, 96(R10)(AX*1)
	ADDQ $128, AX
	JMP colblock32

colblock8:
	CMPQ AX, CX
	JGE coldone
	VMOVUPS (R8)(AX*1), Y0
	VMOVUPS (R10)(AX*1), Y4
	LEAQ (SI)(AX*1), R12
	LEAQ (DI)(AX*1), R13
	MOVQ BX, R9

row8:
	VMOVUPS (R12), Y8
	VMULPS (R13), Y8, Y12
	VADDPS Y12, Y0, Y0
	VADDPS Y8, Y4, Y4
	ADDQ R11, R12
	ADDQ R11, R13
	DECQ R9
	JNZ row8
	VMOVUPS Y0, (R8)(AX*1)
	VMOVUPS Y4, (R10)(AX*1)
	ADDQ $32, AX
	JMP colblock8

coldone:
	VZEROUPPER
	RET

// func lnMoments8(x *float32, stride, n int, k *[8]float64, s *[16]float64)
//
// Eight rows in the lanes of Y0/Y1 (Σe of rows 0-3 and 4-7) and Y2/Y3
// (Σe²), e = x − k: each block of four columns of four rows is transposed
// (4×4, in XMM registers) so that a register holds one column of four rows,
// and the columns are added in order, as the loop adds them.
TEXT ·lnMoments8(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ stride+8(FP), R8
	SHLQ $2, R8
	MOVQ n+16(FP), CX
	SHLQ $2, CX
	MOVQ k+24(FP), DX
	VMOVUPD (DX), Y4
	VMOVUPD 32(DX), Y5
	LEAQ (SI)(R8*1), DI
	LEAQ (DI)(R8*1), BX
	LEAQ (BX)(R8*1), R9
	LEAQ (R9)(R8*1), R10
	LEAQ (R10)(R8*1), R11
	LEAQ (R11)(R8*1), R12
	LEAQ (R12)(R8*1), R13
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	XORQ AX, AX
	TESTQ CX, CX
	JZ m8done

// COLUMN adds column c (four floats in X) of a group to its sums.
#define COLUMN(X, Y, K, S1, S2) \
	VCVTPS2PD X, Y \
	VSUBPD K, Y, Y \
	VADDPD Y, S1, S1 \
	VMULPD Y, Y, Y \
	VADDPD Y, S2, S2

// GROUP transposes four columns of four rows and adds them in order.
#define GROUP(a, b, c, d, K, S1, S2) \
	VMOVUPS (a)(AX*1), X6 \
	VMOVUPS (b)(AX*1), X7 \
	VMOVUPS (c)(AX*1), X8 \
	VMOVUPS (d)(AX*1), X9 \
	VUNPCKLPS X7, X6, X10 \
	VUNPCKHPS X7, X6, X11 \
	VUNPCKLPS X9, X8, X12 \
	VUNPCKHPS X9, X8, X13 \
	VMOVLHPS X12, X10, X6 \
	VMOVHLPS X10, X12, X7 \
	VMOVLHPS X13, X11, X8 \
	VMOVHLPS X11, X13, X9 \
	COLUMN(X6, Y6, K, S1, S2) \
	COLUMN(X7, Y7, K, S1, S2) \
	COLUMN(X8, Y8, K, S1, S2) \
	COLUMN(X9, Y9, K, S1, S2)

m8loop:
	GROUP(SI, DI, BX, R9, Y4, Y0, Y2)
	GROUP(R10, R11, R12, R13, Y5, Y1, Y3)
	ADDQ $16, AX
	CMPQ AX, CX
	JLT m8loop

m8done:
	MOVQ s+32(FP), DX
	VMOVUPD Y0, (DX)
	VMOVUPD Y1, 32(DX)
	VMOVUPD Y2, 64(DX)
	VMOVUPD Y3, 96(DX)
	VZEROUPPER
	RET

// func lnGradSumsRow(dy, xh, w *float32, n int, s *[2]float64)
//
// Lane k of Y0/Y1 sums g[j] for j ≡ k (mod 8), ascending, g = dy·w rounded
// to float32 (dy without w); Y2/Y3 likewise g·x̂. Then Σ = ((p0+p4) +
// (p2+p6)) + ((p1+p5) + (p3+p7)), as gradSumsRow.
TEXT ·lnGradSumsRow(SB), NOSPLIT, $0-40
	MOVQ dy+0(FP), SI
	MOVQ xh+8(FP), DI
	MOVQ w+16(FP), DX
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	XORQ AX, AX

gsloop:
	VMOVUPS (SI)(AX*1), Y4
	TESTQ DX, DX
	JZ gsnow
	VMULPS (DX)(AX*1), Y4, Y4

gsnow:
	VEXTRACTF128 $1, Y4, X5
	VCVTPS2PD X4, Y4
	VCVTPS2PD X5, Y5
	VADDPD Y4, Y0, Y0
	VADDPD Y5, Y1, Y1
	VCVTPS2PD (DI)(AX*1), Y6
	VCVTPS2PD 16(DI)(AX*1), Y7
	VMULPD Y6, Y4, Y4
	VMULPD Y7, Y5, Y5
	VADDPD Y4, Y2, Y2
	VADDPD Y5, Y3, Y3
	ADDQ $32, AX
	CMPQ AX, CX
	JLT gsloop

	MOVQ s+32(FP), BX
	VADDPD Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD X1, X0, X0
	VUNPCKHPD X0, X0, X1
	VADDSD X1, X0, X0
	VMOVSD X0, (BX)
	VADDPD Y3, Y2, Y2
	VEXTRACTF128 $1, Y2, X3
	VADDPD X3, X2, X2
	VUNPCKHPD X2, X2, X3
	VADDSD X3, X2, X2
	VMOVSD X2, 8(BX)
	VZEROUPPER
	RET
