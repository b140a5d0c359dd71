package feature_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// suffix is a feature whose part appends its tag to every body and answer
// piece it edits, and declines the split when decline is set.
type suffix struct {
	tag      string
	decline  string
	optional bool
	fail     bool
}

func (s suffix) Begin(r feature.Request, _ feature.Head) feature.Use {
	if s.decline != "" {
		return decliner{s}
	}
	if s.optional {
		return &optional{suffix: s}
	}
	return s
}

func (s suffix) EditPrefill(b []byte) ([]byte, error) {
	if s.fail {
		return nil, errors.New("refused")
	}
	return append(b, s.tag...), nil
}
func (s suffix) EditLocal(b []byte) ([]byte, error) { return append(b, s.tag...), nil }
func (s suffix) AnswerEdit() func([]byte) []byte {
	return func(b []byte) []byte { return append(b, s.tag...) }
}
func (s suffix) LocalAnswerEdit() func([]byte) []byte { return s.AnswerEdit() }
func (s suffix) HistoryOutcome() string               { return s.tag }

type decliner struct{ suffix }

func (d decliner) DeclinedSplit() string { return d.decline }

type optional struct {
	suffix
	dropped bool
}

func (o *optional) EditPrefill(b []byte) ([]byte, error) {
	if o.dropped {
		return b, nil
	}
	return append(b, o.tag...), nil
}
func (o *optional) DropPrefillEdit() bool { o.dropped = true; return true }

func TestUses(t *testing.T) {
	cases := []struct {
		name     string
		fs       []feature.Feature
		refused  bool
		declined string
		prefill  string
		prefErr  bool
		dropped  bool
		dropEdit string // the prefill body once the optional edits are dropped
		local    string
		answer   string // the split's answer
		localAns string
		noEdit   bool // neither answer edit is made
	}{
		{name: "none", declined: "", prefill: "b", local: "b", answer: "a", localAns: "a", noEdit: true, dropEdit: "b"},
		{name: "in registration order", fs: []feature.Feature{suffix{tag: "1"}, suffix{tag: "2"}},
			prefill: "b12", local: "b12", answer: "a12", localAns: "a12", dropEdit: "b12"},
		{name: "the first decline is the reason", fs: []feature.Feature{suffix{tag: "1", decline: "x"}, suffix{tag: "2", decline: "y"}},
			declined: "x", prefill: "b12", local: "b12", answer: "a12", localAns: "a12", dropEdit: "b12"},
		{name: "a refused prefiller declines nothing", fs: []feature.Feature{suffix{tag: "1", decline: "x"}}, refused: true,
			prefill: "b1", local: "b1", answer: "a1", localAns: "a1", dropEdit: "b1"},
		{name: "an optional edit taken back", fs: []feature.Feature{suffix{tag: "1", optional: true}, suffix{tag: "2"}},
			prefill: "b12", dropped: true, dropEdit: "b2", local: "b12", answer: "a12", localAns: "a12"},
		{name: "more parts than kept inline", fs: []feature.Feature{suffix{tag: "1"}, suffix{tag: "2"}, suffix{tag: "3"},
			suffix{tag: "4"}, suffix{tag: "5"}}, prefill: "b12345", local: "b12345", answer: "a12345", localAns: "a12345", dropEdit: "b12345"},
		{name: "an edit that fails", fs: []feature.Feature{suffix{tag: "1", fail: true}}, prefErr: true,
			local: "b1", answer: "a1", localAns: "a1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var u feature.Uses
			assert.Equal(t, c.declined, u.Begin(c.fs, feature.Request{Refused: c.refused}, nil))
			assert.Equal(t, c.declined != "", u.Declined())
			b, err := u.EditPrefill([]byte("b"))
			if c.prefErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				assert.Equal(t, c.prefill, string(b))
				assert.Equal(t, c.dropped, u.DropOptionalPrefill())
				b, _ = u.EditPrefill([]byte("b"))
				assert.Equal(t, c.dropEdit, string(b))
			}
			b, err = u.EditLocal([]byte("b"))
			require.NoError(t, err)
			assert.Equal(t, c.local, string(b))
			if c.noEdit {
				assert.Nil(t, u.LocalAnswerEdit())
				assert.Nil(t, u.AnswerEdit())
			} else {
				assert.Equal(t, c.answer, string(u.AnswerEdit()([]byte("a"))))
				assert.Equal(t, c.localAns, string(u.LocalAnswerEdit()([]byte("a"))))
				assert.Equal(t, c.fs[0].(suffix).tag, u.HistoryOutcome())
			}
			assert.Nil(t, u.KVSource())
		})
	}
}

// hider is a feature whose part, the same for every request, edits
// answers with a function of its package's, as proxy/hideparams does.
type hider struct{}

func (hider) Begin(feature.Request, feature.Head) feature.Use { return hider{} }
func (hider) AnswerEdit() func([]byte) []byte                 { return keep }
func (hider) LocalAnswerEdit() func([]byte) []byte            { return keep }

func keep(b []byte) []byte { return b }

// declineOnly is a feature whose part declines every split and edits
// nothing.
type declineOnly struct{}

func (declineOnly) Begin(feature.Request, feature.Head) feature.Use { return declineOnly{} }
func (declineOnly) DeclinedSplit() string                           { return "x" }

// A request's parts and their answer edits cost no allocation while the
// parts fit inline and none of their edits keeps anything.
func TestUsesAllocateNothing(t *testing.T) {
	fs := []feature.Feature{hider{}, declineOnly{}}
	u := new(feature.Uses) // a request's, which lives on the heap with it
	allocs := testing.AllocsPerRun(100, func() {
		*u = feature.Uses{}
		u.Begin(fs, feature.Request{}, nil)
		if u.AnswerEdit() == nil || u.LocalAnswerEdit() == nil {
			t.Fatal("no edit")
		}
	})
	assert.Zero(t, allocs)
}
