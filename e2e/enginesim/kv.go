package enginesim

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/crc64"
)

// The KV model. A prompt of N tokens occupies ceil(N/BlockSize) blocks. Block
// j is identified by its chained hash: H(hash of block j-1, tokens of block
// j), so a block's identity depends on the whole prefix, as in vLLM's prefix
// cache. A block's bytes (BlockSize × bytes-per-token, zero past the last
// token of a partial block) are a deterministic pseudo-random stream seeded
// by that hash. The decode step reads the bytes of every prompt block,
// fingerprints each with CRC-64, hashes the fingerprints into a digest and
// derives the output tokens from the digest alone. So correctly transferred
// KV yields exactly the tokens a local prefill yields, and one flipped byte
// anywhere yields different ones.

var crcTable = crc64.MakeTable(crc64.ECMA)

// splitmix64 is the PRNG step used for block contents and token choice.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// BlockHashes returns the chained hash of every block (the last may be
// partial) of tokens.
func BlockHashes(tokens []int, blockSize int) []uint64 {
	n := (len(tokens) + blockSize - 1) / blockSize
	out := make([]uint64, n)
	var prev uint64 = 0xcbf29ce484222325
	for j := 0; j < n; j++ {
		h := splitmix64(prev)
		end := min((j+1)*blockSize, len(tokens))
		for _, t := range tokens[j*blockSize : end] {
			h = splitmix64(h ^ uint64(t))
		}
		h = splitmix64(h ^ uint64(end-j*blockSize))
		out[j] = h
		prev = h
	}
	return out
}

// BlockTokens returns how many tokens block j of an n-token prompt holds.
func BlockTokens(n, blockSize, j int) int {
	return min(blockSize, n-j*blockSize)
}

// FillBlock writes block content for hash into dst: filled token slots get
// the pseudo-random stream, the rest stays zero.
func FillBlock(dst []byte, hash uint64, filledBytes int) {
	clear(dst)
	x := hash
	var word [8]byte
	for i := 0; i < filledBytes; i += 8 {
		x = splitmix64(x)
		binary.LittleEndian.PutUint64(word[:], x)
		copy(dst[i:min(i+8, filledBytes)], word[:])
	}
}

// Fingerprint is the CRC-64 of a block's bytes; it is also the checksum the
// KV side channel sends.
func Fingerprint(block []byte) uint64 { return crc64.Checksum(block, crcTable) }

// Digest hashes the per-block fingerprints, in order, into the value that
// seeds generation.
func Digest(fingerprints []uint64) [32]byte {
	h := sha256.New()
	var b [8]byte
	for _, f := range fingerprints {
		binary.LittleEndian.PutUint64(b[:], f)
		h.Write(b[:])
	}
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d
}

// GenerateToken returns output token i for a KV digest: a deterministic
// function of the digest and the position only.
func GenerateToken(d [32]byte, i int) int {
	seed := binary.LittleEndian.Uint64(d[:8]) ^ binary.LittleEndian.Uint64(d[8:16])
	x := splitmix64(seed ^ splitmix64(uint64(i)+1))
	return FirstTextToken + int(x%uint64(OutputVocabSize))
}

// Fingerprints computes the fingerprint of every block of tokens, taking a
// full block's from cache when cached reports it (the prefix cache) and
// computing the rest. It returns the fingerprints and how many leading full
// blocks came from the cache.
func Fingerprints(tokens []int, blockSize, bytesPerToken int, hashes []uint64, cached func(j int) (uint64, bool)) ([]uint64, int) {
	fps := make([]uint64, len(hashes))
	buf := make([]byte, blockSize*bytesPerToken)
	hits := 0
	prefix := true
	for j, h := range hashes {
		filled := BlockTokens(len(tokens), blockSize, j)
		if prefix && filled == blockSize && cached != nil {
			if fp, ok := cached(j); ok {
				fps[j] = fp
				hits++
				continue
			}
		}
		prefix = false
		FillBlock(buf, h, filled*bytesPerToken)
		fps[j] = Fingerprint(buf)
	}
	return fps, hits
}
