package benchsuite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// openStreams opens n streaming requests to addr and returns once every one
// has received its first event (or ctx ends). closeAll ends them all.
func openStreams(ctx context.Context, addr, path string, body []byte, n int, headers map[string]string) (closeAll func(), opened int, err error) {
	var mu sync.Mutex
	var conns []net.Conn
	closeAll = func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
		conns = nil
	}
	var extra strings.Builder
	for k, v := range headers {
		fmt.Fprintf(&extra, "%s: %s\r\n", k, v)
	}
	req := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n",
		path, addr, len(body), extra.String())
	req = append(req, body...)
	ready := make(chan error, n)
	// Open in batches so the listen backlog never overflows.
	sem := make(chan struct{}, 128)
	for range n {
		go func() {
			sem <- struct{}{}
			d := net.Dialer{Timeout: 10 * time.Second}
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				<-sem
				ready <- err
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if _, err := c.Write(req); err != nil {
				<-sem
				ready <- err
				return
			}
			br := bufio.NewReaderSize(c, 4096)
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					<-sem
					ready <- fmt.Errorf("stream ended before its first event: %w", err)
					return
				}
				if bytes.HasPrefix(line, []byte("data: ")) {
					break
				}
			}
			<-sem
			ready <- nil
			_, _ = io.Copy(io.Discard, br)
		}()
	}
	for range n {
		select {
		case e := <-ready:
			if e != nil && err == nil {
				err = e
			}
			if e == nil {
				opened++
			}
		case <-ctx.Done():
			return closeAll, opened, ctx.Err()
		}
	}
	return closeAll, opened, err
}
