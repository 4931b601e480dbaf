//go:build !purego

#include "textflag.h"

// The optimizers' AVX2 kernels: the loops of optim.go eight lanes at a
// time, with the same float32 operations in the same order (no FMA), so
// that they give the loops' bits. Go's operand order is the reverse of
// Intel's: VMULPS a, b, c is c = b·a; VSUBPS a, b, c is c = b − a.

// func sgdAVX2(n int, w, grad, b *float32, k *sgdCoef)
//
// k: lr+0, mu+4, wd+8 (float32); decay+12, momentum+13 (bool).
//
//	d = g (+ wd·w if decay)
//	momentum:  b = μ·b + d; w = w − lr·b
//	otherwise: w = w − lr·d
//	g = 0
TEXT ·sgdAVX2(SB), NOSPLIT, $0-40
	MOVQ n+0(FP), DX
	MOVQ w+8(FP), AX
	MOVQ grad+16(FP), BX
	MOVQ b+24(FP), CX
	MOVQ k+32(FP), R8
	VBROADCASTSS 0(R8), Y10 // lr
	VBROADCASTSS 4(R8), Y11 // μ
	VBROADCASTSS 8(R8), Y12 // wd
	VXORPS Y15, Y15, Y15
	MOVBLZX 12(R8), R9
	MOVBLZX 13(R8), R10
	TESTQ DX, DX
	JLE done
	TESTL R10, R10
	JZ plain
	TESTL R9, R9
	JNZ momdecay

mom:
	VMULPS (CX), Y11, Y1 // μ·b
	VADDPS (BX), Y1, Y1  // + g
	VMOVUPS Y1, (CX)
	VMULPS Y1, Y10, Y2   // lr·b
	VMOVUPS (AX), Y3
	VSUBPS Y2, Y3, Y3    // w − lr·b
	VMOVUPS Y3, (AX)
	VMOVUPS Y15, (BX)
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, CX
	SUBQ $8, DX
	JNZ mom
	JMP done

momdecay:
	VMOVUPS (AX), Y3
	VMULPS Y3, Y12, Y0   // wd·w
	VMOVUPS (BX), Y4
	VADDPS Y0, Y4, Y0    // d = g + wd·w
	VMULPS (CX), Y11, Y1 // μ·b
	VADDPS Y0, Y1, Y1    // + d
	VMOVUPS Y1, (CX)
	VMULPS Y1, Y10, Y2   // lr·b
	VSUBPS Y2, Y3, Y3    // w − lr·b
	VMOVUPS Y3, (AX)
	VMOVUPS Y15, (BX)
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, CX
	SUBQ $8, DX
	JNZ momdecay
	JMP done

plain:
	VMOVUPS (BX), Y0     // d = g
	VMOVUPS (AX), Y3
	TESTL R9, R9
	JZ plainstep
	VMULPS Y3, Y12, Y1   // wd·w
	VADDPS Y1, Y0, Y0    // d = g + wd·w

plainstep:
	VMULPS Y0, Y10, Y2   // lr·d
	VSUBPS Y2, Y3, Y3    // w − lr·d
	VMOVUPS Y3, (AX)
	VMOVUPS Y15, (BX)
	ADDQ $32, AX
	ADDQ $32, BX
	SUBQ $8, DX
	JNZ plain

done:
	VZEROUPPER
	RET

// func adamAVX2(n int, w, grad, m, v *float32, k *adamCoef)
//
// k: β1+0, 1−β1+4, β2+8, 1−β2+12, √bc2+16, ε+20, lr/bc1+24, wd+28
// (float32); decay+32 (bool).
//
//	d = g (+ wd·w if decay)
//	m = m·β1 + (1−β1)·d
//	v = v·β2 + ((1−β2)·d)·d
//	w = w − (lr/bc1)·(m / (√v/√bc2 + ε))
//	g = 0
TEXT ·adamAVX2(SB), NOSPLIT, $0-48
	MOVQ n+0(FP), SI
	MOVQ w+8(FP), AX
	MOVQ grad+16(FP), BX
	MOVQ m+24(FP), CX
	MOVQ v+32(FP), DX
	MOVQ k+40(FP), R8
	VBROADCASTSS 0(R8), Y8   // β1
	VBROADCASTSS 4(R8), Y9   // 1−β1
	VBROADCASTSS 8(R8), Y10  // β2
	VBROADCASTSS 12(R8), Y11 // 1−β2
	VBROADCASTSS 16(R8), Y12 // √bc2
	VBROADCASTSS 20(R8), Y13 // ε
	VBROADCASTSS 24(R8), Y14 // lr/bc1
	VBROADCASTSS 28(R8), Y6  // wd
	VXORPS Y15, Y15, Y15
	MOVBLZX 32(R8), R9
	TESTQ SI, SI
	JLE adamdone

adamloop:
	VMOVUPS (BX), Y0     // d = g
	VMOVUPS (AX), Y7     // w
	TESTL R9, R9
	JZ moments
	VMULPS Y7, Y6, Y1    // wd·w
	VADDPS Y1, Y0, Y0    // d = g + wd·w

moments:
	VMOVUPS (CX), Y1
	VMULPS Y8, Y1, Y1    // m·β1
	VMULPS Y0, Y9, Y2    // (1−β1)·d
	VADDPS Y2, Y1, Y1    // m
	VMOVUPS Y1, (CX)
	VMOVUPS (DX), Y2
	VMULPS Y10, Y2, Y2   // v·β2
	VMULPS Y0, Y11, Y3   // (1−β2)·d
	VMULPS Y0, Y3, Y3    // ·d
	VADDPS Y3, Y2, Y2    // v
	VMOVUPS Y2, (DX)
	VSQRTPS Y2, Y3       // √v
	VDIVPS Y12, Y3, Y3   // /√bc2
	VADDPS Y13, Y3, Y3   // + ε
	VDIVPS Y3, Y1, Y1    // m/denom
	VMULPS Y1, Y14, Y1   // (lr/bc1)·(m/denom)
	VSUBPS Y1, Y7, Y7    // w − ...
	VMOVUPS Y7, (AX)
	VMOVUPS Y15, (BX)
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, CX
	ADDQ $32, DX
	SUBQ $8, SI
	JNZ adamloop

adamdone:
	VZEROUPPER
	RET
