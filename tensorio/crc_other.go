//go:build !amd64 || purego

package tensorio

const hasFold = false

func crc32cFold(dst, src *byte, n int, crc uint32, mode int) uint32 {
	panic("tensorio: crc32cFold without hardware support")
}

func crc32cHybrid(src *byte, blocks int, crc uint32) uint32 {
	panic("tensorio: crc32cHybrid without hardware support")
}
