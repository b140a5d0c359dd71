package kvtransfer_test

import (
	"testing"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
)

func TestConformanceMem(t *testing.T) {
	kvtest.RunConformance(t, "", func(testing.TB) kvtransfer.Transport { return kvtransfer.NewMemTransport() })
}

func TestConformanceTCP(t *testing.T) {
	kvtest.RunConformance(t, "127.0.0.1:0", func(testing.TB) kvtransfer.Transport {
		return kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{})
	})
}
