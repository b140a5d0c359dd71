package enginesim

import (
	"net/http"
	"strconv"
)

// sink writes one answer: a JSON body, or server-sent events flushed one by
// one. With dieAfter > 0 it cuts the connection after that many events (or
// half a JSON body), the die-mid-stream fault.
type sink struct {
	w        http.ResponseWriter
	stream   bool
	started  bool
	events   int
	dieAfter int
	// ended is set once the engine has finished the answer: a JSON body
	// or a stream's last events written, or the connection cut by a
	// fault. A request whose client leaves before it is not ended was
	// cancelled.
	ended bool
}

func newSink(w http.ResponseWriter, stream bool, dieAfter int) *sink {
	return &sink{w: w, stream: stream, dieAfter: dieAfter}
}

// start sends a stream's head (HTTP 200 and its headers) at once, before
// the first event: vLLM and SGLang answer a streamed request with a
// Starlette StreamingResponse, whose head uvicorn writes as soon as the
// response starts, before the engine has queued, loaded KV or made a token.
func (k *sink) start() {
	if k.started {
		return
	}
	h := k.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	k.w.WriteHeader(http.StatusOK)
	k.started = true
	k.flush()
}

// send writes SSE events, starting the stream on first use.
func (k *sink) send(evs ...sseEvent) error {
	k.start()
	buf := make([]byte, 0, 512)
	for _, ev := range evs {
		if k.dieAfter > 0 && k.events >= k.dieAfter {
			k.flush()
			k.ended = true
			panic(http.ErrAbortHandler)
		}
		buf = buf[:0]
		if ev.name != "" {
			buf = append(buf, "event: "...)
			buf = append(buf, ev.name...)
			buf = append(buf, '\n')
		}
		buf = append(buf, "data: "...)
		buf = append(buf, ev.data...)
		buf = append(buf, "\n\n"...)
		if _, err := k.w.Write(buf); err != nil {
			return err
		}
		k.events++
		k.flush()
	}
	return nil
}

// end writes a stream's last events and marks the answer ended when they
// were written.
func (k *sink) end(evs ...sseEvent) error {
	if err := k.send(evs...); err != nil {
		return err
	}
	k.ended = true
	return nil
}

func (k *sink) flush() {
	if f, ok := k.w.(http.Flusher); ok {
		f.Flush()
	}
}

// json writes a complete JSON answer.
func (k *sink) json(status int, body []byte) {
	h := k.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	k.w.WriteHeader(status)
	k.ended = true
	if k.dieAfter > 0 {
		_, _ = k.w.Write(body[:len(body)/2])
		k.flush()
		panic(http.ErrAbortHandler)
	}
	_, _ = k.w.Write(body)
}

// fail writes an error answer: as JSON when nothing was sent yet, else as an
// SSE error event and [DONE].
func (k *sink) fail(status int, body []byte) {
	if k.started {
		_ = k.end(sseEvent{data: body}, doneEvent)
		return
	}
	k.json(status, body)
}
