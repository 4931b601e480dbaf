//go:build !purego

#include "textflag.h"

// The micro-kernel for arm64 (see sgemm.go). Go's assembler has no
// mnemonics for NEON's floating-point FMUL and FADD, so they are WORDs,
// each with the instruction it encodes; the product is the first operand
// (Vn) of the add, as on amd64. Never FMLA.

// func kernel8x8NEON(kc int, p *float32, pl, pr int, q *float32, ql int, c *float32, ldc int, beta float32, flags int) (special bool)
//
// V0-V15: the 8x8 tile of C, row r in V(2r), V(2r+1). V16, V17: row l of
// the panel (at R2, rows R8 bytes apart). V18, V19: s of the 8 rows (p
// packed: pl = 8, pr = 1). V20-V31: products.
TEXT ·kernel8x8NEON(SB), NOSPLIT, $0-81
	MOVD kc+0(FP), R0
	MOVD p+8(FP), R1
	MOVD q+32(FP), R2
	MOVD ql+40(FP), R8
	LSL  $2, R8
	MOVD c+48(FP), R3
	MOVD ldc+56(FP), R4
	LSL  $2, R4
	MOVD flags+72(FP), R5
	TBNZ $0, R5, neon_load
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	VEOR V14.B16, V14.B16, V14.B16
	VEOR V15.B16, V15.B16, V15.B16
	B    neon_start

neon_load:
	MOVD R3, R6
	VLD1 (R6), [V0.S4, V1.S4]
	ADD  R4, R6
	VLD1 (R6), [V2.S4, V3.S4]
	ADD  R4, R6
	VLD1 (R6), [V4.S4, V5.S4]
	ADD  R4, R6
	VLD1 (R6), [V6.S4, V7.S4]
	ADD  R4, R6
	VLD1 (R6), [V8.S4, V9.S4]
	ADD  R4, R6
	VLD1 (R6), [V10.S4, V11.S4]
	ADD  R4, R6
	VLD1 (R6), [V12.S4, V13.S4]
	ADD  R4, R6
	VLD1 (R6), [V14.S4, V15.S4]
	TBZ   $1, R5, neon_check
	FMOVS beta+64(FP), F29
	WORD  $0x4f9d9000 // fmul v0.4s, v0.4s, v29.s[0]
	WORD  $0x4f9d9021 // fmul v1.4s, v1.4s, v29.s[0]
	WORD  $0x4f9d9042 // fmul v2.4s, v2.4s, v29.s[0]
	WORD  $0x4f9d9063 // fmul v3.4s, v3.4s, v29.s[0]
	WORD  $0x4f9d9084 // fmul v4.4s, v4.4s, v29.s[0]
	WORD  $0x4f9d90a5 // fmul v5.4s, v5.4s, v29.s[0]
	WORD  $0x4f9d90c6 // fmul v6.4s, v6.4s, v29.s[0]
	WORD  $0x4f9d90e7 // fmul v7.4s, v7.4s, v29.s[0]
	WORD  $0x4f9d9108 // fmul v8.4s, v8.4s, v29.s[0]
	WORD  $0x4f9d9129 // fmul v9.4s, v9.4s, v29.s[0]
	WORD  $0x4f9d914a // fmul v10.4s, v10.4s, v29.s[0]
	WORD  $0x4f9d916b // fmul v11.4s, v11.4s, v29.s[0]
	WORD  $0x4f9d918c // fmul v12.4s, v12.4s, v29.s[0]
	WORD  $0x4f9d91ad // fmul v13.4s, v13.4s, v29.s[0]
	WORD  $0x4f9d91ce // fmul v14.4s, v14.4s, v29.s[0]
	WORD  $0x4f9d91ef // fmul v15.4s, v15.4s, v29.s[0]

neon_check:
	// c+0 differs from c in its bits only for -0 and a signalling NaN.
	VEOR V31.B16, V31.B16, V31.B16
	VEOR V30.B16, V30.B16, V30.B16
	WORD $0x4e3fd414 // fadd v20.4s, v0.4s, v31.4s
	VEOR V20.B16, V0.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd434 // fadd v20.4s, v1.4s, v31.4s
	VEOR V20.B16, V1.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd454 // fadd v20.4s, v2.4s, v31.4s
	VEOR V20.B16, V2.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd474 // fadd v20.4s, v3.4s, v31.4s
	VEOR V20.B16, V3.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd494 // fadd v20.4s, v4.4s, v31.4s
	VEOR V20.B16, V4.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd4b4 // fadd v20.4s, v5.4s, v31.4s
	VEOR V20.B16, V5.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd4d4 // fadd v20.4s, v6.4s, v31.4s
	VEOR V20.B16, V6.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd4f4 // fadd v20.4s, v7.4s, v31.4s
	VEOR V20.B16, V7.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd514 // fadd v20.4s, v8.4s, v31.4s
	VEOR V20.B16, V8.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd534 // fadd v20.4s, v9.4s, v31.4s
	VEOR V20.B16, V9.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd554 // fadd v20.4s, v10.4s, v31.4s
	VEOR V20.B16, V10.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd574 // fadd v20.4s, v11.4s, v31.4s
	VEOR V20.B16, V11.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd594 // fadd v20.4s, v12.4s, v31.4s
	VEOR V20.B16, V12.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd5b4 // fadd v20.4s, v13.4s, v31.4s
	VEOR V20.B16, V13.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd5d4 // fadd v20.4s, v14.4s, v31.4s
	VEOR V20.B16, V14.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	WORD $0x4e3fd5f4 // fadd v20.4s, v15.4s, v31.4s
	VEOR V20.B16, V15.B16, V20.B16
	VORR V20.B16, V30.B16, V30.B16
	VMOV V30.D[0], R6
	VMOV V30.D[1], R7
	ORR  R6, R7, R7
	CBNZ R7, neon_special

neon_start:
	CBZ R0, neon_store

neon_loop:
	VLD1   (R2), [V16.S4, V17.S4]
	ADD    R8, R2
	VLD1.P 32(R1), [V18.S4, V19.S4]
	WORD $0x4f929214 // fmul v20.4s, v16.4s, v18.s[0]
	WORD $0x4f929235 // fmul v21.4s, v17.4s, v18.s[0]
	WORD $0x4e20d680 // fadd v0.4s, v20.4s, v0.4s
	WORD $0x4e21d6a1 // fadd v1.4s, v21.4s, v1.4s
	WORD $0x4fb29216 // fmul v22.4s, v16.4s, v18.s[1]
	WORD $0x4fb29237 // fmul v23.4s, v17.4s, v18.s[1]
	WORD $0x4e22d6c2 // fadd v2.4s, v22.4s, v2.4s
	WORD $0x4e23d6e3 // fadd v3.4s, v23.4s, v3.4s
	WORD $0x4f929a18 // fmul v24.4s, v16.4s, v18.s[2]
	WORD $0x4f929a39 // fmul v25.4s, v17.4s, v18.s[2]
	WORD $0x4e24d704 // fadd v4.4s, v24.4s, v4.4s
	WORD $0x4e25d725 // fadd v5.4s, v25.4s, v5.4s
	WORD $0x4fb29a1a // fmul v26.4s, v16.4s, v18.s[3]
	WORD $0x4fb29a3b // fmul v27.4s, v17.4s, v18.s[3]
	WORD $0x4e26d746 // fadd v6.4s, v26.4s, v6.4s
	WORD $0x4e27d767 // fadd v7.4s, v27.4s, v7.4s
	WORD $0x4f93921c // fmul v28.4s, v16.4s, v19.s[0]
	WORD $0x4f93923d // fmul v29.4s, v17.4s, v19.s[0]
	WORD $0x4e28d788 // fadd v8.4s, v28.4s, v8.4s
	WORD $0x4e29d7a9 // fadd v9.4s, v29.4s, v9.4s
	WORD $0x4fb3921e // fmul v30.4s, v16.4s, v19.s[1]
	WORD $0x4fb3923f // fmul v31.4s, v17.4s, v19.s[1]
	WORD $0x4e2ad7ca // fadd v10.4s, v30.4s, v10.4s
	WORD $0x4e2bd7eb // fadd v11.4s, v31.4s, v11.4s
	WORD $0x4f939a14 // fmul v20.4s, v16.4s, v19.s[2]
	WORD $0x4f939a35 // fmul v21.4s, v17.4s, v19.s[2]
	WORD $0x4e2cd68c // fadd v12.4s, v20.4s, v12.4s
	WORD $0x4e2dd6ad // fadd v13.4s, v21.4s, v13.4s
	WORD $0x4fb39a16 // fmul v22.4s, v16.4s, v19.s[3]
	WORD $0x4fb39a37 // fmul v23.4s, v17.4s, v19.s[3]
	WORD $0x4e2ed6ce // fadd v14.4s, v22.4s, v14.4s
	WORD $0x4e2fd6ef // fadd v15.4s, v23.4s, v15.4s
	SUB  $1, R0
	CBNZ R0, neon_loop

neon_store:
	// An infinity or a NaN in the tile: the chain may differ (a zero s).
	MOVW $0x7f800000, R6
	VDUP R6, V31.S4
	VEOR V30.B16, V30.B16, V30.B16
	VAND  V31.B16, V0.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V1.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V2.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V3.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V4.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V5.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V6.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V7.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V8.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V9.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V10.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V11.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V12.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V13.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V14.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VAND  V31.B16, V15.B16, V20.B16
	VCMEQ V31.S4, V20.S4, V20.S4
	VORR  V20.B16, V30.B16, V30.B16
	VMOV V30.D[0], R6
	VMOV V30.D[1], R7
	ORR  R6, R7, R7
	CBNZ R7, neon_special
	MOVD R3, R6
	VST1 [V0.S4, V1.S4], (R6)
	ADD  R4, R6
	VST1 [V2.S4, V3.S4], (R6)
	ADD  R4, R6
	VST1 [V4.S4, V5.S4], (R6)
	ADD  R4, R6
	VST1 [V6.S4, V7.S4], (R6)
	ADD  R4, R6
	VST1 [V8.S4, V9.S4], (R6)
	ADD  R4, R6
	VST1 [V10.S4, V11.S4], (R6)
	ADD  R4, R6
	VST1 [V12.S4, V13.S4], (R6)
	ADD  R4, R6
	VST1 [V14.S4, V15.S4], (R6)
	MOVD $0, R7
	MOVB R7, special+80(FP)
	RET

neon_special:
	MOVD $1, R7
	MOVB R7, special+80(FP)
	RET
