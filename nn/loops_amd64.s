//go:build !purego

#include "textflag.h"

// The deterministic loops of BatchNorm (norm.go), ReLU and Add
// (elementwise.go), eight values at a time, with the same operations in
// the same order for each value (no FMA; BatchNorm's sums over rows
// ascending, a channel a lane), so that they give the loops' bits. The
// BatchNorm kernels take rows rows of stride floats and their first n
// channels, the others n values; n is a positive multiple of 8. Go's
// operand order is the reverse of Intel's: VSUBPS a, b, c is c = b − a.

// RELU_MASK keeps Y1's values (dy) where the ReLU output at addr is > 0
// and zeroes the others, as reluGradAVX2 does (Y15 zero; Y8 scratch).
#define RELU_MASK(addr) \
	VMOVDQU addr, Y8 \
	VPSUBD Y8, Y15, Y8 \
	VPSRAD $31, Y8, Y8 \
	VPAND Y8, Y1, Y1

// func bnSumAVX2(x *float32, rows, stride, n int, part *float64)
//
//	part[j] += float64(x[r·stride+j])
TEXT ·bnSumAVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ rows+8(FP), CX
	MOVQ stride+16(FP), AX
	SHLQ $2, AX
	MOVQ n+24(FP), DX
	SHLQ $2, DX
	MOVQ part+32(FP), DI
	TESTQ CX, CX
	JLE sumdone

sumrow:
	XORQ R9, R9  // channel offset in float32 bytes
	XORQ R10, R10 // in float64 bytes

sumcol:
	VCVTPS2PD (SI)(R9*1), Y0
	VCVTPS2PD 16(SI)(R9*1), Y1
	VADDPD (DI)(R10*1), Y0, Y0
	VADDPD 32(DI)(R10*1), Y1, Y1
	VMOVUPD Y0, (DI)(R10*1)
	VMOVUPD Y1, 32(DI)(R10*1)
	ADDQ $32, R9
	ADDQ $64, R10
	CMPQ R9, DX
	JLT sumcol
	ADDQ AX, SI
	DECQ CX
	JNZ sumrow

sumdone:
	VZEROUPPER
	RET

// func bnSqDevAVX2(x *float32, rows, stride, n int, mean, part *float64)
//
//	d = float64(x[r·stride+j]) − mean[j]; part[j] += d·d
TEXT ·bnSqDevAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ rows+8(FP), CX
	MOVQ stride+16(FP), AX
	SHLQ $2, AX
	MOVQ n+24(FP), DX
	SHLQ $2, DX
	MOVQ mean+32(FP), BX
	MOVQ part+40(FP), DI
	TESTQ CX, CX
	JLE sqdone

sqrow:
	XORQ R9, R9
	XORQ R10, R10

sqcol:
	VCVTPS2PD (SI)(R9*1), Y0
	VCVTPS2PD 16(SI)(R9*1), Y1
	VSUBPD (BX)(R10*1), Y0, Y0
	VSUBPD 32(BX)(R10*1), Y1, Y1
	VMULPD Y0, Y0, Y0
	VMULPD Y1, Y1, Y1
	VADDPD (DI)(R10*1), Y0, Y0
	VADDPD 32(DI)(R10*1), Y1, Y1
	VMOVUPD Y0, (DI)(R10*1)
	VMOVUPD Y1, 32(DI)(R10*1)
	ADDQ $32, R9
	ADDQ $64, R10
	CMPQ R9, DX
	JLT sqcol
	ADDQ AX, SI
	DECQ CX
	JNZ sqrow

sqdone:
	VZEROUPPER
	RET

// func bnNormAVX2(x, y *float32, rows, stride, n int, mean, scale, bias *float32, relu bool)
//
//	y[r·stride+j] = float32((x − mean[j])·scale[j]) + bias[j], then reluAVX2's max(y, 0) if relu
TEXT ·bnNormAVX2(SB), NOSPLIT, $0-65
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ rows+16(FP), CX
	MOVQ stride+24(FP), AX
	SHLQ $2, AX
	MOVQ n+32(FP), DX
	SHLQ $2, DX
	MOVQ mean+40(FP), R10
	MOVQ scale+48(FP), R11
	MOVQ bias+56(FP), R12
	MOVBQZX relu+64(FP), R13
	VXORPS Y15, Y15, Y15
	TESTQ CX, CX
	JLE normdone

normrow:
	XORQ R9, R9

normcol:
	VMOVUPS (SI)(R9*1), Y0
	VSUBPS (R10)(R9*1), Y0, Y0
	VMULPS (R11)(R9*1), Y0, Y0
	VADDPS (R12)(R9*1), Y0, Y0
	TESTQ R13, R13
	JZ normstore
	VCMPPS $6, Y15, Y0, Y1 // !(y ≤ 0)
	VANDPS Y0, Y1, Y0

normstore:
	VMOVUPS Y0, (DI)(R9*1)
	ADDQ $32, R9
	CMPQ R9, DX
	JLT normcol
	ADDQ AX, SI
	ADDQ AX, DI
	DECQ CX
	JNZ normrow

normdone:
	VZEROUPPER
	RET

// func bnGradSumsAVX2(x, dy *float32, rows, stride, n int, mean, inv *float32, p1, p2 *float64, y *float32)
//
//	x̂ = float64((x − mean[j])·inv[j]); p1[j] += float64(dy); p2[j] += float64(dy)·x̂
//
// with dy through reluGradAVX2's mask of y first, if y is not nil.
TEXT ·bnGradSumsAVX2(SB), NOSPLIT, $0-80
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DI
	MOVQ rows+16(FP), CX
	MOVQ stride+24(FP), AX
	SHLQ $2, AX
	MOVQ n+32(FP), DX
	SHLQ $2, DX
	MOVQ mean+40(FP), R11
	MOVQ inv+48(FP), R12
	MOVQ p1+56(FP), R13
	MOVQ p2+64(FP), BX
	MOVQ y+72(FP), R8
	VPXOR Y15, Y15, Y15
	TESTQ CX, CX
	JLE gsdone

gsrow:
	XORQ R9, R9
	XORQ R10, R10

gscol:
	VMOVUPS (SI)(R9*1), Y0
	VSUBPS (R11)(R9*1), Y0, Y0
	VMULPS (R12)(R9*1), Y0, Y0 // x̂ in float32
	VMOVUPS (DI)(R9*1), Y1     // dy
	CMPQ y+72(FP), $0
	JEQ gsnomask
	RELU_MASK((R8)(R9*1))

gsnomask:
	VCVTPS2PD X0, Y2
	VEXTRACTF128 $1, Y0, X3
	VCVTPS2PD X3, Y3
	VCVTPS2PD X1, Y4
	VEXTRACTF128 $1, Y1, X5
	VCVTPS2PD X5, Y5
	VADDPD (R13)(R10*1), Y4, Y6
	VADDPD 32(R13)(R10*1), Y5, Y7
	VMOVUPD Y6, (R13)(R10*1)
	VMOVUPD Y7, 32(R13)(R10*1)
	VMULPD Y2, Y4, Y2
	VMULPD Y3, Y5, Y3
	VADDPD (BX)(R10*1), Y2, Y2
	VADDPD 32(BX)(R10*1), Y3, Y3
	VMOVUPD Y2, (BX)(R10*1)
	VMOVUPD Y3, 32(BX)(R10*1)
	ADDQ $32, R9
	ADDQ $64, R10
	CMPQ R9, DX
	JLT gscol
	ADDQ AX, SI
	ADDQ AX, DI
	ADDQ AX, R8
	DECQ CX
	JNZ gsrow

gsdone:
	VZEROUPPER
	RET

// func bnInputGradAVX2(x, dy, dx *float32, rows, stride, n int, mean, inv, k, a, b, y *float32)
//
//	x̂ = (x − mean[j])·inv[j]; dx = k[j]·(dy − a[j] − float32(x̂·b[j]))
//
// with dy through reluGradAVX2's mask of y first, if y is not nil.
TEXT ·bnInputGradAVX2(SB), NOSPLIT, $0-96
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DI
	MOVQ dx+16(FP), BX
	MOVQ rows+24(FP), CX
	MOVQ stride+32(FP), AX
	SHLQ $2, AX
	MOVQ n+40(FP), DX
	SHLQ $2, DX
	MOVQ mean+48(FP), R10
	MOVQ inv+56(FP), R11
	MOVQ k+64(FP), R8
	MOVQ a+72(FP), R12
	MOVQ b+80(FP), R13
	MOVQ y+88(FP), R14
	VPXOR Y15, Y15, Y15
	TESTQ CX, CX
	JLE dxdone

dxrow:
	XORQ R9, R9

dxcol:
	VMOVUPS (SI)(R9*1), Y0
	VSUBPS (R10)(R9*1), Y0, Y0
	VMULPS (R11)(R9*1), Y0, Y0 // x̂
	VMULPS (R13)(R9*1), Y0, Y0 // x̂·b
	VMOVUPS (DI)(R9*1), Y1
	CMPQ y+88(FP), $0
	JEQ dxnomask
	RELU_MASK((R14)(R9*1))

dxnomask:
	VSUBPS (R12)(R9*1), Y1, Y1 // dy − a
	VSUBPS Y0, Y1, Y1          // − x̂·b
	VMULPS (R8)(R9*1), Y1, Y1  // k·(...)
	VMOVUPS Y1, (BX)(R9*1)
	ADDQ $32, R9
	CMPQ R9, DX
	JLT dxcol
	ADDQ AX, SI
	ADDQ AX, DI
	ADDQ AX, BX
	ADDQ AX, R14
	DECQ CX
	JNZ dxrow

dxdone:
	VZEROUPPER
	RET

// func reluAVX2(x, y *float32, n int)
//
//	y = x where !(x ≤ 0) (x > 0 or NaN), else +0: Go's max(x, 0)
TEXT ·reluAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	SHLQ $2, CX
	XORQ R9, R9
	VXORPS Y15, Y15, Y15
	TESTQ CX, CX
	JLE reludone

reluloop:
	VMOVUPS (SI)(R9*1), Y0
	VCMPPS $6, Y15, Y0, Y1 // !(x ≤ 0)
	VANDPS Y0, Y1, Y1
	VMOVUPS Y1, (DI)(R9*1)
	ADDQ $32, R9
	CMPQ R9, CX
	JLT reluloop

reludone:
	VZEROUPPER
	RET

// func reluGradAVX2(y, dy, dx *float32, n int)
//
//	dx = dy & (−int32(bits(y)) >> 31): dy where y > 0, else +0 (the loop's mask)
TEXT ·reluGradAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), SI
	MOVQ dy+8(FP), DI
	MOVQ dx+16(FP), BX
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	XORQ R9, R9
	VPXOR Y15, Y15, Y15
	TESTQ CX, CX
	JLE rgdone

rgloop:
	VMOVDQU (SI)(R9*1), Y0
	VPSUBD Y0, Y15, Y1 // −bits
	VPSRAD $31, Y1, Y1
	VPAND (DI)(R9*1), Y1, Y1
	VMOVDQU Y1, (BX)(R9*1)
	ADDQ $32, R9
	CMPQ R9, CX
	JLT rgloop

rgdone:
	VZEROUPPER
	RET

// func addAVX2(a, b, y *float32, n int)
//
//	y = a + b (y may be a)
TEXT ·addAVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ y+16(FP), BX
	MOVQ n+24(FP), CX
	SHLQ $2, CX
	XORQ R9, R9
	TESTQ CX, CX
	JLE adddone

addloop:
	VMOVUPS (SI)(R9*1), Y0
	VADDPS (DI)(R9*1), Y0, Y0
	VMOVUPS Y0, (BX)(R9*1)
	ADDQ $32, R9
	CMPQ R9, CX
	JLT addloop

adddone:
	VZEROUPPER
	RET
