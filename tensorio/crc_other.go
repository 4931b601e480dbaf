//go:build !amd64 || purego

package tensorio

const hasFold = false

func crc32cHybrid(dst, src *byte, blocks int, crc uint32, mode int) uint32 {
	panic("tensorio: crc32cHybrid without hardware support")
}
