package multiturn

import (
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// head is a request head of one value per header.
type head map[string]string

func (h head) Peek(k string) []byte {
	if v, ok := h[k]; ok {
		return []byte(v)
	}
	return nil
}

func (h head) PeekAll(k string) [][]byte {
	if v := h.Peek(k); v != nil {
		return [][]byte{v}
	}
	return nil
}

// nopLogger is a request's logger that logs nothing.
type nopLogger struct{ nopLog }

func (nopLogger) Logger() *zerolog.Logger { l := zerolog.Nop(); return &l }

var errBadRequest = errors.New("bad request body")

// TestSessionReaderAdmit: the session key is the session header's, else
// the body's conversation_id (a string), which leaves the body either way;
// a key that is empty, too long or not printable ASCII names no session.
func TestSessionReaderAdmit(t *testing.T) {
	for _, tc := range []struct {
		name, header, body string
		session, want      string // want: the body after admission
	}{
		{name: "none", body: `{"model":"m"}`, want: `{"model":"m"}`},
		{name: "header", header: "conv-1", body: `{"model":"m"}`, session: "conv-1", want: `{"model":"m"}`},
		{name: "conversation_id", body: `{"model":"m","conversation_id":"conv-2"}`, session: "conv-2", want: `{"model":"m"}`},
		{name: "header over conversation_id, which still goes", header: "conv-1", body: `{"conversation_id":"conv-2","model":"m"}`,
			session: "conv-1", want: `{"model":"m"}`},
		{name: "conversation_id not a string", body: `{"model":"m","conversation_id":7}`, want: `{"model":"m"}`},
		{name: "longest key", header: strings.Repeat("k", MaxSessionKeyLen), body: `{}`, session: strings.Repeat("k", MaxSessionKeyLen), want: `{}`},
		{name: "too long", header: strings.Repeat("k", MaxSessionKeyLen+1), body: `{}`, want: `{}`},
		{name: "not printable", body: `{"conversation_id":"a b"}`, want: `{}`},
		{name: "empty conversation_id", body: `{"conversation_id":""}`, want: `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SessionReader{Header: "x-session-token", BadRequest: errBadRequest}
			h := head{}
			if tc.header != "" {
				h["x-session-token"] = tc.header
			}
			a := &feature.Admission{API: connectors.APIChat, Body: []byte(tc.body), Log: nopLogger{}}
			step, err := s.Admit(a, h)
			assert.Nil(t, step)
			require.NoError(t, err)
			assert.Equal(t, tc.session, a.Session)
			assert.JSONEq(t, tc.want, string(a.Body))
		})
	}
}
