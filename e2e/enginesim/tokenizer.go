package enginesim

import (
	"hash/fnv"
	"unicode"
)

// The simulator's tokenizer is deliberately simple and fully documented, so a
// test can predict token counts:
//
//   - The text is split into pieces: a maximal run of letters and digits is
//     one piece; every other non-space rune is a piece of its own; whitespace
//     separates pieces and is dropped.
//   - A piece's token id is FNV-1a-32(piece bytes) mod VocabSize, plus
//     FirstTextToken, so ids below FirstTextToken stay free for special tokens.
//
// Generated tokens are rendered by Word: a leading space and a pronounceable
// word built from two syllables, so streamed text reads like text.
const (
	// EOSToken is the end-of-sequence token id.
	EOSToken = 2
	// FirstTextToken is the smallest id of an ordinary token.
	FirstTextToken = 100
	// VocabSize is the number of ordinary prompt token ids.
	VocabSize = 50000
	// OutputVocabSize is the number of distinct generated tokens.
	OutputVocabSize = len(syllables) * len(syllables)
)

var syllables = [...]string{
	"ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "va", "de", "zu", "fe", "go", "hi", "ja", "ku",
	"la", "mo", "nu", "pe", "qi", "ro", "sa", "te", "vo", "wa", "xi", "ye", "zo", "be", "ci", "du",
	"an", "el", "in", "on", "ur", "ba", "co", "di", "fu", "ga", "he", "jo", "ki", "lu", "ma", "ni",
	"pa", "qu", "re", "si", "to", "vu", "we", "xa", "yo", "za", "bi", "ce", "do", "fa", "gi", "ho",
}

// Tokenize turns text into token ids as documented above.
func Tokenize(text string) []int {
	ids := make([]int, 0, len(text)/4+1)
	start := -1
	flush := func(end int) {
		if start >= 0 {
			ids = append(ids, pieceID(text[start:end]))
			start = -1
		}
	}
	for i, r := range text {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if start < 0 {
				start = i
			}
		case unicode.IsSpace(r):
			flush(i)
		default:
			flush(i)
			ids = append(ids, pieceID(string(r)))
		}
	}
	flush(len(text))
	return ids
}

func pieceID(piece string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(piece))
	return int(h.Sum32()%VocabSize) + FirstTextToken
}

// Word renders a generated token id as text (" " + two syllables). EOS and
// other special ids render as "".
func Word(id int) string {
	if id < FirstTextToken {
		return ""
	}
	n := (id - FirstTextToken) % OutputVocabSize
	return " " + syllables[n/len(syllables)] + syllables[n%len(syllables)]
}

// Message is one chat turn after normalisation.
type Message struct {
	Role    string
	Content string
}

// ChatPrompt renders chat messages with the simulator's template:
// "<|role|>\ncontent\n" per message, then "<|assistant|>\n" (continue.go
// has the template's controls).
func ChatPrompt(msgs []Message) string { return chatTemplate(msgs, true) }
