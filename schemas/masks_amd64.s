#include "textflag.h"

// func specialMasks64(p *byte) (quote, backslash, ctl uint64)
//
// Bit i of each mask is set when p[i] (i < 64) is '"', '\\', or below 0x20.
// SSE2 (in every amd64): four 16-byte blocks, from the last to the first.
TEXT ·specialMasks64(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ $0x2222222222222222, DX // X1 = 16 × '"'
	MOVQ DX, X1
	PUNPCKLQDQ X1, X1
	MOVQ $0x5c5c5c5c5c5c5c5c, DX // X2 = 16 × '\\'
	MOVQ DX, X2
	PUNPCKLQDQ X2, X2
	MOVQ $0x1f1f1f1f1f1f1f1f, DX // X3 = 16 × 0x1f
	MOVQ DX, X3
	PUNPCKLQDQ X3, X3
	XORQ AX, AX
	XORQ BX, BX
	XORQ CX, CX
	MOVQ $48, R8       // offset of the block being read: 48, 32, 16, 0
	LEAQ 48(SI), SI

block:
	MOVOU (SI), X0
	MOVOU X0, X4
	PCMPEQB X1, X4
	PMOVMSKB X4, DX
	SHLQ $16, AX
	ORQ  DX, AX
	MOVOU X0, X5
	PCMPEQB X2, X5
	PMOVMSKB X5, DX
	SHLQ $16, BX
	ORQ  DX, BX
	MOVOU X0, X6
	PMINUB X3, X6      // min(x, 0x1f) == x: x < 0x20
	PCMPEQB X0, X6
	PMOVMSKB X6, DX
	SHLQ $16, CX
	ORQ  DX, CX
	SUBQ $16, SI
	SUBQ $16, R8
	JGE  block

	MOVQ AX, quote+8(FP)
	MOVQ BX, backslash+16(FP)
	MOVQ CX, ctl+24(FP)
	RET
