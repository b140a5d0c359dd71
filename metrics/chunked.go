package metrics

import "github.com/prometheus/client_golang/prometheus"

// Chunked decode outcomes (the outcome label of chunked_decodes_total).
const (
	// ChunkedCompleted: the stitched answer was written whole (a terminal
	// finish_reason, an empty chunk, or the budget spent).
	ChunkedCompleted = "completed"
	// ChunkedFailed: a chunk failed; before the answer began the client got
	// an error status, after it an error event and [DONE].
	ChunkedFailed = "failed"
	// ChunkedFallback: the first chunk of a split failed to load the remote
	// KV and the request degraded to a local prefill.
	ChunkedFallback = "fallback"
	// ChunkedClientLeft: the client left; the chunk in flight was cancelled.
	ChunkedClientLeft = "client_left"
)

// Chunked holds the collectors of the chunked decode (--decode-chunk-size).
type Chunked struct {
	// Decodes counts decodes run as a series of chunks, by outcome.
	Decodes *prometheus.CounterVec
	// Chunks counts the chunk requests sent to the local engine.
	Chunks prometheus.Counter
}

// NewChunked creates the chunked decode collectors and registers them on reg.
func NewChunked(reg prometheus.Registerer) *Chunked {
	c := &Chunked{
		Decodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_chunked_decodes_total",
			Help: "Decodes run as a series of at most --decode-chunk-size token requests, by outcome (completed, failed, fallback, client_left).",
		}, []string{"outcome"}),
		Chunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_decode_chunks_total",
			Help: "Chunk requests of chunked decodes sent to the local engine.",
		}),
	}
	reg.MustRegister(c.Decodes, c.Chunks)
	for _, o := range []string{ChunkedCompleted, ChunkedFailed, ChunkedFallback, ChunkedClientLeft} {
		c.Decodes.WithLabelValues(o)
	}
	return c
}
