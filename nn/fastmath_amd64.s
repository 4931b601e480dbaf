//go:build !purego

#include "textflag.h"

// GELU's forward pass, softmax's exponentials, sigmoid and tanh four values at a time
// (fastmath_amd64.go), with the float64 operations of normal and expFast
// (fastmath.go) in their order and no FMA, so that they give their bits. Go's operand order is the
// reverse of Intel's: VSUBPD a, b, c is c = b − a.

// EXP_KR computes k = floor(e·log2e + 0.5) into Y4 and r = (e − k·ln2Hi) −
// k·ln2Lo into Y5 for e in Y3, and starts the series in Y6.
#define EXP_KR \
	VMULPD 96(R11), Y3, Y4 \
	VADDPD 128(R11), Y4, Y4 \
	VROUNDPD $1, Y4, Y4 \
	VMULPD 160(R11), Y4, Y5 \
	VSUBPD Y5, Y3, Y5 \
	VMULPD 192(R11), Y4, Y6 \
	VSUBPD Y6, Y5, Y5 \
	VMOVUPD 224(R11), Y6

// EXP_STEP is a Horner step of the series in Y6 in r (Y5): Y6 = Y6·r +
// the coefficient at off.
#define EXP_STEP(off) \
	VMULPD Y5, Y6, Y6 \
	VADDPD off(R11), Y6, Y6

// SERIES takes the series in Y6 (EXP_KR's start) in r (Y5) to (e^r − 1)/r:
// expSeries.
#define SERIES \
	EXP_STEP(256) \
	EXP_STEP(288) \
	EXP_STEP(320) \
	EXP_STEP(352) \
	EXP_STEP(384) \
	EXP_STEP(416) \
	EXP_STEP(448) \
	EXP_STEP(480) \
	EXP_STEP(512)

// MILLS sets dst to the Mills coefficient at off in the table (R10) of
// each lane's k' (Y2: VPERMPS's indices, Y3: k' < 4, Y1: k' < 8): the
// table's row holds three groups of four.
#define MILLS(off, dst) \
	VPERMPS off(R10), Y2, Y7 \
	VPERMPS (off+32)(R10), Y2, Y8 \
	VPERMPS (off+64)(R10), Y2, dst \
	VBLENDVPD Y1, Y8, dst, dst \
	VBLENDVPD Y3, Y7, dst, dst

// MILLS_STEP is a Horner step of R in w (Y9): Y11 = Y11·w + the
// coefficient at off.
#define MILLS_STEP(off) \
	MILLS(off, Y12) \
	VMULPD Y9, Y11, Y11 \
	VADDPD Y12, Y11, Y11

// POW2K sets Y7 to 2^k for k in Y4: (k + 1023) << 52.
#define POW2K \
	VCVTTPD2DQY Y4, X7 \
	VPMOVSXDQ X7, Y7 \
	VPADDQ 640(R11), Y7, Y7 \
	VPSLLQ $52, Y7, Y7

// func geluAVX2(x, y, cdf, pdf *float32, n int, k *vecCoef) int
TEXT ·geluAVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ cdf+16(FP), R8
	MOVQ pdf+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), R11
	LEAQ 992(R11), R10 // mills
	XORQ AX, AX

loop:
	CMPQ AX, CX
	JGE done
	VCVTPS2PD (SI)(AX*4), Y0 // u
	VANDPD 0(R11), Y0, Y1    // t = |u|
	VCMPPD $0x11, 32(R11), Y1, Y2 // t < 12, false for NaN
	VMOVMSKPD Y2, DX
	CMPL DX, $15
	JNE done

	// φ(u) = invSqrt2Pi·expFast(−0.5·u·u): e^e with e = k·ln2 + r, and
	// R(t) on [k', k'+1), k' = int(t), in w = t − (k' + 0.5): the two
	// Horner chains interleaved. R's coefficients come from the table's
	// three rows of four (VPERMPS moves a float64 as two float32 halves;
	// gathers are slower).
	VMULPD 64(R11), Y0, Y3
	VMULPD Y0, Y3, Y3        // e
	EXP_KR

	VCVTTPD2DQY Y1, X8
	VCVTDQ2PD X8, Y9
	VADDPD 128(R11), Y9, Y9
	VSUBPD Y9, Y1, Y9        // w
	VPMOVSXDQ X8, Y10        // k'
	VPAND 672(R11), Y10, Y7  // k' mod 4
	VPSLLQ $1, Y7, Y7
	VPSLLQ $32, Y7, Y8
	VPOR Y8, Y7, Y7
	VPADDQ 704(R11), Y7, Y2  // VPERMPS's indices: 2(k' mod 4), 2(k' mod 4)+1
	VMOVDQU 736(R11), Y3
	VPCMPGTQ Y10, Y3, Y3     // k' < 4
	VMOVDQU 768(R11), Y1
	VPCMPGTQ Y10, Y1, Y1     // k' < 8 (t is w now)
	MILLS(768, Y11)
	EXP_STEP(256)
	MILLS_STEP(672)
	EXP_STEP(288)
	MILLS_STEP(576)
	EXP_STEP(320)
	MILLS_STEP(480)
	EXP_STEP(352)
	MILLS_STEP(384)
	EXP_STEP(384)
	MILLS_STEP(288)
	EXP_STEP(416)
	MILLS_STEP(192)
	EXP_STEP(448)
	MILLS_STEP(96)
	EXP_STEP(480)
	MILLS_STEP(0)
	EXP_STEP(512)
	EXP_STEP(544)
	POW2K
	VMULPD Y7, Y6, Y6
	VMULPD 576(R11), Y6, Y6  // φ

	// q = φ·R; Φ = 1 − q for u >= 0, q below
	VMULPD Y11, Y6, Y11
	VMOVUPD 608(R11), Y12
	VSUBPD Y11, Y12, Y12
	VXORPD Y13, Y13, Y13
	VCMPPD $0x1D, Y13, Y0, Y13
	VBLENDVPD Y13, Y12, Y11, Y14
	VMULPD Y14, Y0, Y15      // y = u·Φ

	VCVTPD2PSY Y15, X15
	VMOVUPS X15, (DI)(AX*4)
	VCVTPD2PSY Y14, X14
	VMOVUPS X14, (R8)(AX*4)
	VCVTPD2PSY Y6, X6
	VMOVUPS X6, (R9)(AX*4)
	ADDQ $4, AX
	JMP loop

done:
	MOVQ AX, ret+48(FP)
	VZEROUPPER
	RET

// func softmaxExpAVX2(x, y *float32, n int, m float64, sum *float64, k *vecCoef) int
TEXT ·softmaxExpAVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	VBROADCASTSD m+24(FP), Y15
	MOVQ sum+32(FP), R8
	MOVQ k+40(FP), R11
	VMOVSD (R8), X14
	XORQ AX, AX

sloop:
	CMPQ AX, CX
	JGE sdone
	VCVTPS2PD (SI)(AX*4), Y3
	VSUBPD Y15, Y3, Y3            // e
	VCMPPD $0x1D, 800(R11), Y3, Y1 // e >= −708
	VCMPPD $0x12, 832(R11), Y3, Y2 // e <= 709
	VANDPD Y2, Y1, Y1
	VCMPPD $0x11, 864(R11), Y3, Y2 // e < −745.1: 0
	VORPD Y2, Y1, Y1
	VMOVMSKPD Y1, DX
	CMPL DX, $15
	JNE sdone

	EXP_KR
	SERIES
	EXP_STEP(544)
	POW2K
	VMULPD Y7, Y6, Y6
	VANDNPD Y6, Y2, Y6            // 0 below −745.1

	VCVTPD2PSY Y6, X7
	VMOVUPS X7, (DI)(AX*4)
	VADDSD X6, X14, X14           // the sum, lane after lane
	VPERMILPD $1, X6, X7
	VADDSD X7, X14, X14
	VEXTRACTF128 $1, Y6, X7
	VADDSD X7, X14, X14
	VPERMILPD $1, X7, X7
	VADDSD X7, X14, X14
	ADDQ $4, AX
	JMP sloop

sdone:
	VMOVSD X14, (R8)
	MOVQ AX, ret+48(FP)
	VZEROUPPER
	RET

// func sigmoidAVX2(x, y *float32, n int, k *vecCoef) int
//
//	y = float32(1 / (1 + expFast(−x)))
TEXT ·sigmoidAVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), R11
	XORQ AX, AX
	VXORPD Y15, Y15, Y15

gloop:
	CMPQ AX, CX
	JGE gdone
	VCVTPS2PD (SI)(AX*4), Y3
	VSUBPD Y3, Y15, Y3             // e = −x
	VCMPPD $0x1D, 800(R11), Y3, Y1 // e >= −708
	VCMPPD $0x12, 832(R11), Y3, Y2 // e <= 709
	VANDPD Y2, Y1, Y1
	VMOVMSKPD Y1, DX
	CMPL DX, $15
	JNE gdone
	EXP_KR
	SERIES
	EXP_STEP(544)
	POW2K
	VMULPD Y7, Y6, Y6             // e^−x
	VADDPD 608(R11), Y6, Y6
	VMOVUPD 608(R11), Y0
	VDIVPD Y6, Y0, Y6              // 1 / (1 + e^−x)
	VCVTPD2PSY Y6, X6
	VMOVUPS X6, (DI)(AX*4)
	ADDQ $4, AX
	JMP gloop

gdone:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET

// func tanhAVX2(x, y *float32, n int, k *vecCoef) int
//
//	t = |x|; e = expm1Fast(2t); y = float32(copysign(e / (e + 2), x))
TEXT ·tanhAVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), R11
	XORQ AX, AX

tloop:
	CMPQ AX, CX
	JGE tdone
	VCVTPS2PD (SI)(AX*4), Y0       // x
	VANDPD 0(R11), Y0, Y1          // t = |x|
	VCMPPD $0x12, 896(R11), Y1, Y2 // t <= 20, false for NaN
	VMOVMSKPD Y2, DX
	CMPL DX, $15
	JNE tdone
	VADDPD Y1, Y1, Y3              // 2t
	EXP_KR
	SERIES
	VMULPD Y5, Y6, Y6              // q = e^r − 1
	POW2K
	VMULPD Y7, Y6, Y6
	VSUBPD 608(R11), Y7, Y7
	VADDPD Y7, Y6, Y6              // e = 2^k·q + (2^k − 1)
	VADDPD 928(R11), Y6, Y8
	VDIVPD Y8, Y6, Y6              // e / (e + 2)
	VMOVUPD 0(R11), Y9
	VANDNPD Y0, Y9, Y9             // x's sign
	VORPD Y9, Y6, Y6
	VCVTPD2PSY Y6, X6
	VMOVUPS X6, (DI)(AX*4)
	ADDQ $4, AX
	JMP tloop

tdone:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET

// func normalizeAVX2(y *float32, n int, inv float64, k *vecCoef)
//
//	p = float64(y)·inv; y = float32(p), or 0 where p < 2^−126
TEXT ·normalizeAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ n+8(FP), CX
	VBROADCASTSD inv+16(FP), Y15
	MOVQ k+24(FP), R11
	XORQ AX, AX

nloop:
	CMPQ AX, CX
	JGE ndone
	VCVTPS2PD (DI)(AX*4), Y0
	VMULPD Y15, Y0, Y0
	VCMPPD $0x11, 960(R11), Y0, Y1 // p < 2^−126, false for NaN
	VANDNPD Y0, Y1, Y0
	VCVTPD2PSY Y0, X0
	VMOVUPS X0, (DI)(AX*4)
	ADDQ $4, AX
	JMP nloop

ndone:
	VZEROUPPER
	RET
