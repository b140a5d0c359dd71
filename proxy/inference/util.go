package inference

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
)

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

func StatusLabel(code int) string { return strconv.Itoa(code) }
