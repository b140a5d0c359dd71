package enginesim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenize(t *testing.T) {
	tests := []struct {
		text   string
		pieces []string
	}{
		{"", nil},
		{"   \n\t", nil},
		{"hello", []string{"hello"}},
		{"Hello, world!", []string{"Hello", ",", "world", "!"}},
		{"a1b2 c3", []string{"a1b2", "c3"}},
		{"<|user|>\nhi", []string{"<", "|", "user", "|", ">", "hi"}},
		{"naïve café", []string{"naïve", "café"}},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			got := Tokenize(tc.text)
			want := make([]int, 0, len(tc.pieces))
			for _, p := range tc.pieces {
				want = append(want, pieceID(p))
			}
			assert.Equal(t, want, append([]int{}, got...))
			for _, id := range got {
				assert.GreaterOrEqual(t, id, FirstTextToken)
				assert.Less(t, id, FirstTextToken+VocabSize)
			}
		})
	}
}

func TestTokenizeDeterministicAndDistinct(t *testing.T) {
	a := Tokenize("the quick brown fox")
	require.Equal(t, a, Tokenize("the quick brown fox"))
	assert.NotEqual(t, a, Tokenize("the quick brown cat"))
	assert.NotEqual(t, pieceID("Hello"), pieceID("hello"), "the tokenizer is case-sensitive")
}

func TestWord(t *testing.T) {
	assert.Equal(t, "", Word(EOSToken))
	assert.Equal(t, " kaka", Word(FirstTextToken))
	assert.Equal(t, " kalo", Word(FirstTextToken+1))
	assert.Equal(t, Word(FirstTextToken), Word(FirstTextToken+OutputVocabSize), "ids wrap around the output vocabulary")
}

func TestChatPrompt(t *testing.T) {
	got := ChatPrompt([]Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}})
	assert.Equal(t, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n", got)
}
