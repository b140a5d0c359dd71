package core

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// upstreamVerdict is what one path's parser made of an upstream answer
// read whole: its status and body, or its error.
type upstreamVerdict struct {
	status int
	body   []byte
	err    error
	clean  bool // nothing came after the answer: the connection may be pooled
}

// fuzzAnswerHead and fuzzAnswerBody are the bounds the fuzz targets read
// answers under.
const (
	fuzzAnswerHead = 1024
	fuzzAnswerBody = 4096
)

// answerByTransport reads data as upstream.Transport.Do reads an answer.
func answerByTransport(data []byte) upstreamVerdict {
	br := bufio.NewReaderSize(bytes.NewReader(data), fuzzAnswerHead)
	var resp fasthttp.Response
	if err := upstream.ReadAnswer(br, &resp, false, fuzzAnswerBody, nil); err != nil {
		return upstreamVerdict{err: err}
	}
	return upstreamVerdict{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...),
		clean: br.Buffered() == 0 && !resp.ConnectionClose()}
}

// answerByLane reads data as the lane reads an answer (readHead, then
// readRaw), arriving in two reads cut at cut.
func answerByLane(data []byte, cut int) upstreamVerdict {
	cut = min(max(cut, 0), len(data))
	reads := [][]byte{data[:cut], data[cut:]}
	var h fasthttp.ResponseHeader
	var rd bytes.Reader
	br := bufio.NewReaderSize(nil, fuzzAnswerHead)
	var head []byte
	var a *rawhttp.Answer
	interim := 0
	for _, in := range reads {
		if len(in) == 0 {
			continue
		}
		if a == nil {
			b := in
			if len(head) > 0 {
				head = append(head, in...)
				b = head
			}
			rest, whole, err := rawhttp.ParseAnswerHead(&h, &rd, br, b, fuzzAnswerHead, &interim)
			if err != nil {
				return upstreamVerdict{err: err}
			}
			if !whole {
				head = append(head[:0], rest...)
				continue
			}
			a = &rawhttp.Answer{Body: upstream.HeadDecoder(&h), Status: h.StatusCode(), Max: fuzzAnswerBody}
			h.CopyTo(&a.Head)
			if err := a.Begin(&h); err != nil {
				return upstreamVerdict{err: err}
			}
			in = rest
		}
		if err := a.Feed(in); err != nil {
			return upstreamVerdict{err: err}
		}
	}
	switch {
	case a == nil:
		return upstreamVerdict{err: upstream.ErrUpClosed}
	case !a.Body.Done() && a.Body.Mode() != httpbody.UntilClose:
		return upstreamVerdict{err: errors.New("connection closed mid-body")}
	}
	return upstreamVerdict{status: a.Status, body: a.Buf, clean: a.Body.Done() && !a.Excess && !a.Head.ConnectionClose()}
}

// FuzzUpstreamAnswer: an upstream's answer, whatever its bytes, never
// panics either path's parser, is held to the body bound, and is taken or
// refused alike by the fasthttp path (upstream.ReadAnswer) and the lane
// (rawhttp.ParseAnswerHead, rawhttp.Answer), however it is cut into reads: the same
// status and body, the same malformed-answer verdict, the same verdict on
// pooling the connection; and neither's error quotes the answer.
func FuzzUpstreamAnswer(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n{}\r\n0\r\nTrailer: a\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 562949953421312\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000000000002\r\n{}\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("400\r\n"+strings.Repeat("a", 0x400)+"\r\n", 5) + "0\r\n\r\n",
		"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 1100),
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ",
		"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
		"HTTP/1.1 200 OK\r\nSet-Cookie: session=SECRET\r\nContent-Length: zz\r\n\r\n{}",
		"",
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		tr := answerByTransport(data)
		ln := answerByLane(data, int(cut))
		for _, v := range []upstreamVerdict{tr, ln} {
			if len(v.body) > fuzzAnswerBody {
				t.Fatalf("a body of %d bytes past the bound", len(v.body))
			}
			if v.err == nil && v.status < 200 {
				t.Fatalf("status %d taken as an answer", v.status)
			}
		}
		for _, v := range []upstreamVerdict{tr, ln} {
			if v.err != nil && bytes.Contains(data, []byte("SECRET")) && strings.Contains(v.err.Error(), "SECRET") {
				t.Fatalf("the error quotes the answer: %v", v.err)
			}
		}
		if (tr.err == nil) != (ln.err == nil) {
			t.Fatalf("the paths disagree: fasthttp's %v, the lane's %v", tr.err, ln.err)
		}
		if tr.err != nil {
			if errors.Is(tr.err, upstream.ErrBadUpstreamAnswer) != errors.Is(ln.err, upstream.ErrBadUpstreamAnswer) {
				t.Fatalf("the paths disagree on a bad answer: fasthttp's %v, the lane's %v", tr.err, ln.err)
			}
			return
		}
		if tr.status != ln.status || !bytes.Equal(tr.body, ln.body) {
			t.Fatalf("the paths disagree: fasthttp's %d %q, the lane's %d %q", tr.status, tr.body, ln.status, ln.body)
		}
		if tr.clean != ln.clean {
			t.Fatalf("the paths disagree on pooling: fasthttp's %v, the lane's %v", tr.clean, ln.clean)
		}
	})
}
