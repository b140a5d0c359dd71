package multiturnbench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// Message is one chat message as the client sends it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// turnPlan is what a conversation sends on one turn besides its history:
// the new user message and the answer's token cap.
type turnPlan struct {
	user      string
	maxTokens int
}

// Conversation is one chat whose context grows turn by turn: turn k sends
// every earlier message, the assistant's answer of turn k-1 exactly as it
// was received, and a new user message. The user messages and token caps
// are drawn from the seed and the conversation's index alone, so every mode
// of a run sends the same conversation (the engines' answers are a function
// of the prompt, so the answers match too).
type Conversation struct {
	// ID is the session key sent with every turn.
	ID string

	plan []turnPlan
	msgs []Message
	// sent counts the turns sent; answered the answers recorded.
	sent, answered int
}

// NewConversation draws the turns of conversation index: user messages of
// userWords words (one engine-sim token each) and token caps of maxTokens.
func NewConversation(seed uint64, index, turns int, userWords, maxTokens loadgen.Dist) *Conversation {
	r := rand.New(rand.NewPCG(seed, uint64(index)+0x6d74))
	c := &Conversation{ID: fmt.Sprintf("conv-%d-%d", seed, index)}
	for range turns {
		n := draw(r, userWords)
		c.plan = append(c.plan, turnPlan{user: userText(r, n), maxTokens: draw(r, maxTokens)})
	}
	return c
}

// Turns is how many turns the conversation has.
func (c *Conversation) Turns() int { return len(c.plan) }

// Next returns the messages and token cap of the next turn (a copy: the
// history, then the new user message).
func (c *Conversation) Next() ([]Message, int, error) {
	switch {
	case c.sent >= len(c.plan):
		return nil, 0, fmt.Errorf("%s: all %d turns sent", c.ID, len(c.plan))
	case c.answered < c.sent:
		return nil, 0, fmt.Errorf("%s: turn %d has no answer recorded", c.ID, c.sent)
	}
	p := c.plan[c.sent]
	c.msgs = append(c.msgs, Message{Role: "user", Content: p.user})
	c.sent++
	return slices.Clone(c.msgs), p.maxTokens, nil
}

// Answer records the assistant's answer of the turn just sent, verbatim:
// the next turn carries it back byte for byte, as a chat client does, so
// that the next prompt extends exactly what the decode engine produced.
func (c *Conversation) Answer(content string) error {
	if c.answered >= c.sent {
		return errors.New(c.ID + ": an answer without a turn sent")
	}
	c.msgs = append(c.msgs, Message{Role: "assistant", Content: content})
	c.answered++
	return nil
}

// vocabulary are the stems of the generated words; a stem and a number
// make one engine-sim token (a run of letters and digits).
var vocabulary = strings.Fields(`the a of and to in is was for on that with as by at from it an be this
which or are were not have has had but all their they one two new more other some time into than
cache block token prefill decode model server request stream kernel memory transfer network layer`)

// userText is n words separated by spaces.
func userText(r *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		b.WriteString(strconv.Itoa(r.IntN(1000)))
	}
	return b.String()
}

// draw is a uniform value of d.
func draw(r *rand.Rand, d loadgen.Dist) int {
	if d.Max <= d.Min {
		return d.Min
	}
	return d.Min + r.IntN(d.Max-d.Min+1)
}

// PromptTokens is the prompt length engine-sim computes for msgs (its chat
// template cut by its tokenizer, e2e/enginesim). It stands in when an
// answer reports no usage.
func PromptTokens(msgs []Message) int {
	em := make([]enginesim.Message, len(msgs))
	for i, m := range msgs {
		em[i] = enginesim.Message{Role: m.Role, Content: m.Content}
	}
	return len(enginesim.Tokenize(enginesim.ChatPrompt(em)))
}
