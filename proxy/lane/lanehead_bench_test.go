package lane

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// BenchmarkLaneHeads is the lane's head work for one request: the client's
// request parsed and checked, the request's state begun and its upstream
// head built; the engine's answer head parsed and the client's written.
func BenchmarkLaneHeads(b *testing.B) {
	p := &inference.Proxy{Sidecar: &core.Sidecar{Cfg: core.DefaultConfig(), M: metrics.New(prometheus.NewRegistry(), 0), Log: zerolog.Nop()}}
	ll := &laneLoop{ln: &lane{p: p, local: "127.0.0.1:8000"}, br: bufio.NewReaderSize(nil, p.Cfg.Guard.MaxHeaderBytes)}
	ll.req.DisableNormalizing()
	ll.resp.DisableNormalizing()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 128) + `"}],"max_tokens":16,"stream":true}`
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar:8000\r\nUser-Agent: pd-bench\r\nContent-Type: application/json\r\n" +
		"Accept: */*\r\nX-Request-ID: 0123456789abcdef\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	answer := []byte("HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n" +
		"cache-control: no-cache\r\nx-request-id: 0123456789abcdef\r\ntransfer-encoding: chunked\r\n\r\n")
	var sent, out []byte
	b.ReportAllocs()
	for b.Loop() {
		api, reqBody, lr, ok := ll.parse(req)
		if !ok {
			b.Fatal("not served by the lane")
		}
		r := p.StartRequest(core.Arrival{ID: lr.ID, Head: &ll.req, Body: reqBody, Local: ll.ln.local, API: api})
		sent = append(rawhttp.AppendLegHead(sent[:0], &ll.req, r.Local, r.ID, len(reqBody)), reqBody...)
		ll.resp.Reset()
		ll.rd.Reset(answer)
		ll.br.Reset(&ll.rd)
		if err := ll.resp.Read(ll.br); err != nil {
			b.Fatal(err)
		}
		// Wired as newConn wires it, on the stack: the lane makes a
		// connection per client connection, not per request.
		var lc laneConn
		lc.ll, lc.r, lc.client.keepAlive, lc.reply.lc = ll, r, true, &lc
		out = lc.reply.appendHead(out[:0], &ll.resp, -1)
		r.Cancel(nil)
	}
}
