package upstream

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBudgetReserveRelease(t *testing.T) {
	b := NewBudget(100, nil)
	assert.True(t, b.TryReserve(60))
	assert.False(t, b.TryReserve(41), "past the bound")
	assert.True(t, b.TryReserve(40), "up to the bound")
	assert.True(t, b.TryReserve(0))
	assert.False(t, b.TryReserve(1<<62), "no overflow")
	b.Release(60)
	assert.Equal(t, int64(40), b.Used())
	b.Release(40)
	assert.Zero(t, b.Used())
}
