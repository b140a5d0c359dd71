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
func (s suffix) EditAnswer(b []byte) []byte         { return append(b, s.tag...) }
func (s suffix) EditLocalAnswer(b []byte) []byte    { return append(b, s.tag...) }
func (s suffix) HistoryOutcome() string             { return s.tag }

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
		answer   string // the split's answer, after a connector rewrite "R"
		localAns string
		noEdit   bool // neither answer edit is made
	}{
		{name: "none", declined: "", prefill: "b", local: "b", answer: "aR", localAns: "a", noEdit: true, dropEdit: "b"},
		{name: "in registration order", fs: []feature.Feature{suffix{tag: "1"}, suffix{tag: "2"}},
			prefill: "b12", local: "b12", answer: "aR12", localAns: "a12", dropEdit: "b12"},
		{name: "the first decline is the reason", fs: []feature.Feature{suffix{tag: "1", decline: "x"}, suffix{tag: "2", decline: "y"}},
			declined: "x", prefill: "b12", local: "b12", answer: "aR12", localAns: "a12", dropEdit: "b12"},
		{name: "a refused prefiller declines nothing", fs: []feature.Feature{suffix{tag: "1", decline: "x"}}, refused: true,
			prefill: "b1", local: "b1", answer: "aR1", localAns: "a1", dropEdit: "b1"},
		{name: "an optional edit taken back", fs: []feature.Feature{suffix{tag: "1", optional: true}, suffix{tag: "2"}},
			prefill: "b12", dropped: true, dropEdit: "b2", local: "b12", answer: "aR12", localAns: "a12"},
		{name: "an edit that fails", fs: []feature.Feature{suffix{tag: "1", fail: true}}, prefErr: true,
			local: "b1", answer: "aR1", localAns: "a1"},
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
			rewrite := func(d []byte) []byte { return append(d, 'R') }
			assert.Equal(t, c.answer, string(u.AnswerEdit(rewrite)([]byte("a"))))
			if c.noEdit {
				assert.Nil(t, u.LocalAnswerEdit())
				assert.Nil(t, u.AnswerEdit(nil))
			} else {
				assert.Equal(t, c.localAns, string(u.LocalAnswerEdit()([]byte("a"))))
				assert.Equal(t, c.fs[0].(suffix).tag, u.HistoryOutcome())
			}
			assert.Nil(t, u.KVSource())
		})
	}
}
