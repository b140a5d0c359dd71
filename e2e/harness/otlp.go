package harness

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
)

// Span is one span an OTLP receiver was sent.
type Span struct {
	Name    string
	TraceID string            // hex
	Attrs   map[string]string // string-valued span attributes
	Service string            // the resource's service.name
}

// OTLPReceiver is a plaintext OTLP/gRPC trace receiver (the collector's
// TraceService) on a loopback address: it keeps the spans exported to it.
type OTLPReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	// Addr is host:port of the listener.
	Addr  string
	mu    sync.Mutex
	spans []Span
}

// StartOTLPReceiver serves an OTLPReceiver on l until the test ends.
func StartOTLPReceiver(t testing.TB, l net.Listener) *OTLPReceiver {
	t.Helper()
	r := &OTLPReceiver{Addr: l.Addr().String()}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return r
}

// Export implements the collector's TraceService.
func (r *OTLPReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := stringAttrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					Name:    sp.GetName(),
					TraceID: hex.EncodeToString(sp.GetTraceId()),
					Attrs:   stringAttrs(sp.GetAttributes()),
					Service: service,
				})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Span returns the last span named name that was received.
func (r *OTLPReceiver) Span(name string) (Span, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.spans) - 1; i >= 0; i-- {
		if r.spans[i].Name == name {
			return r.spans[i], true
		}
	}
	return Span{}, false
}

// Count is how many spans were received.
func (r *OTLPReceiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.spans)
}

func stringAttrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	return m
}
