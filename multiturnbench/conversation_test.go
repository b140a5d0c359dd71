package multiturnbench

import (
	"slices"
	"testing"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// Every turn carries the earlier answers back byte for byte, whatever they
// hold, after the messages that preceded them, and ends with a new user
// message.
func TestConversationCarriesAnswersVerbatim(t *testing.T) {
	answers := []string{
		" kalo mine suta",               // engine-sim's answers start with a space
		"trailing space and newline \n", // whitespace is part of the answer
		"",                              // an empty answer is still a message
		" unicode: é ü 漢字, and \"quotes\" and \\ backslash",
		"\n\nleading newlines",
	}
	c := NewConversation(7, 0, len(answers)+1, loadgen.Dist{Min: 5, Max: 9}, loadgen.Dist{Min: 3, Max: 3})
	var sent [][]Message
	for turn := range len(answers) + 1 {
		msgs, maxTokens, err := c.Next()
		if err != nil {
			t.Fatalf("turn %d: %v", turn+1, err)
		}
		if maxTokens != 3 {
			t.Errorf("turn %d: max_tokens %d, want 3", turn+1, maxTokens)
		}
		if got, want := len(msgs), 2*turn+1; got != want {
			t.Fatalf("turn %d: %d messages, want %d", turn+1, got, want)
		}
		for i, m := range msgs {
			want := "user"
			if i%2 == 1 {
				want = "assistant"
			}
			if m.Role != want {
				t.Errorf("turn %d message %d: role %q, want %q", turn+1, i, m.Role, want)
			}
		}
		for k := range turn {
			if got := msgs[2*k+1].Content; got != answers[k] {
				t.Errorf("turn %d: answer of turn %d carried back as %q, want %q", turn+1, k+1, got, answers[k])
			}
		}
		// The history is exactly the previous turn's messages and answer.
		if turn > 0 {
			prev := sent[turn-1]
			if !slices.Equal(msgs[:len(prev)], prev) {
				t.Errorf("turn %d does not extend turn %d's messages", turn+1, turn)
			}
		}
		if words := len(enginesim.Tokenize(msgs[len(msgs)-1].Content)); words < 5 || words > 9 {
			t.Errorf("turn %d: user message of %d words, want 5-9", turn+1, words)
		}
		sent = append(sent, msgs)
		if turn < len(answers) {
			if err := c.Answer(answers[turn]); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Next returned copies: recording an answer changed none of them.
	if got := len(sent[0]); got != 1 {
		t.Errorf("turn 1's messages grew to %d", got)
	}
}

func TestConversationOrder(t *testing.T) {
	d := loadgen.Dist{Min: 2, Max: 2}
	c := NewConversation(1, 0, 2, d, d)
	if err := c.Answer("x"); err == nil {
		t.Error("an answer before any turn was accepted")
	}
	if _, _, err := c.Next(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Next(); err == nil {
		t.Error("a turn without the previous answer was accepted")
	}
	if err := c.Answer("a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Answer("b"); err == nil {
		t.Error("two answers to one turn were accepted")
	}
	if _, _, err := c.Next(); err != nil {
		t.Fatal(err)
	}
	if err := c.Answer("c"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Next(); err == nil {
		t.Error("a turn past the last was accepted")
	}
}

// The same seed and index draw the same conversation (so both modes send
// the same turns); another index draws another.
func TestConversationDeterministic(t *testing.T) {
	words, caps := loadgen.Dist{Min: 10, Max: 50}, loadgen.Dist{Min: 1, Max: 100}
	a, b := NewConversation(3, 1, 4, words, caps), NewConversation(3, 1, 4, words, caps)
	other := NewConversation(3, 2, 4, words, caps)
	if !slices.Equal(a.plan, b.plan) {
		t.Error("the same seed and index drew different turns")
	}
	if slices.Equal(a.plan, other.plan) {
		t.Error("two conversations drew the same turns")
	}
	if a.ID == other.ID {
		t.Errorf("two conversations share the session key %q", a.ID)
	}
}
