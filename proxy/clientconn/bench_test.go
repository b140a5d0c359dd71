package clientconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// keepAll is an Adopter that keeps what it is given.
type keepAll struct{}

func (keepAll) Adopt(*Conn) {}

// BenchmarkConn is a client connection's share of one request on
// fasthttp's path: its bytes accounted as read and the request counted
// when its handler runs (with an Adopter, too); the watch of its client queued and stopped; the
// peek for a client that closed its side; and the head checks.
func BenchmarkConn(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	c := &Conn{TCPConn: s.(*net.TCPConn), tails: NewTailPool(4096)}
	defer c.Close()
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar:8000\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	var rc fasthttp.RequestCtx
	rc.Init2(c, nil, false)
	if err := rc.Request.Header.Read(bufio.NewReader(bytes.NewReader(req))); err != nil {
		b.Fatal(err)
	}
	b.Run("count", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.account(req) // as Read accounts what it read
			Counted(&rc)()
		}
		if !c.Synced() {
			b.Fatal("not synced")
		}
	})
	b.Run("count-adopted", func(b *testing.B) {
		c.adopter = keepAll{}
		defer func() { c.adopter = nil }()
		b.ReportAllocs()
		for b.Loop() {
			c.account(req)
			Counted(&rc)()
		}
		if !c.Synced() {
			b.Fatal("not synced")
		}
	})
	b.Run("watch", func(b *testing.B) {
		a := NewArmer(WatchDelay, errors.New("client gone"))
		_, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		b.ReportAllocs()
		for b.Loop() {
			a.Watch(c, cancel, time.Now()).Stop()
		}
	})
	b.Run("peer-closed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if PeerClosed(c) {
				b.Fatal("closed")
			}
		}
	})
	b.Run("head-checks", func(b *testing.B) {
		h := &rc.Request.Header
		b.ReportAllocs()
		for b.Loop() {
			DropTrailers(h)
			if BadHeaderName(h) || !ServedVersion(h.Protocol()) || !NormalTarget(h.RequestURI(), rc.URI()) || OriginForm(&rc) != nil {
				b.Fatal("refused")
			}
		}
	})
}
