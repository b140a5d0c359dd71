package ssrf

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// reviewer allows what its grants hold ("verb resource"), and may fail.
type reviewer struct {
	grants map[string]bool
	err    error
	asked  []string
}

func (r *reviewer) Create(_ context.Context, s *authorizationv1.SelfSubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SelfSubjectAccessReview, error) {
	if r.err != nil {
		return nil, r.err
	}
	a := s.Spec.ResourceAttributes
	key := a.Verb + " " + a.Resource
	r.asked = append(r.asked, a.Namespace+":"+key+"@"+a.Group)
	s.Status.Allowed = r.grants[key]
	return s, nil
}

func TestCheckAccess(t *testing.T) {
	all := map[string]bool{"get pods": true, "list pods": true, "watch pods": true,
		"get inferencepools": true, "list inferencepools": true, "watch inferencepools": true}
	cfg := PoolConfig{Namespace: "pd", Name: "pool", Group: GroupV1}
	for _, tc := range []struct {
		name    string
		drop    []string
		err     error
		missing string
	}{
		{name: "all granted"},
		{name: "no pods", drop: []string{"get pods", "list pods", "watch pods"}, missing: "missing get pods, list pods, watch pods in namespace pd"},
		{name: "no watch of pools", drop: []string{"watch inferencepools"}, missing: "missing watch inferencepools.inference.networking.k8s.io in namespace pd"},
		{name: "review fails", err: errors.New("boom"), missing: "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := map[string]bool{}
			for k, v := range all {
				g[k] = v
			}
			for _, d := range tc.drop {
				delete(g, d)
			}
			r := &reviewer{grants: g, err: tc.err}
			err := CheckAccess(context.Background(), r, cfg)
			if tc.missing == "" {
				require.NoError(t, err)
				assert.Len(t, r.asked, 6)
				assert.Contains(t, r.asked, "pd:list inferencepools@inference.networking.k8s.io")
				assert.Contains(t, r.asked, "pd:watch pods@")
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.missing)
			assert.Equal(t, tc.err == nil, errors.Is(err, ErrNoAccess))
		})
	}
}
