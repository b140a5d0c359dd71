package ssrf

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AccessReviewer asks the API server whether the caller may do something
// (the SelfSubjectAccessReviews client of authorization.k8s.io/v1).
type AccessReviewer interface {
	Create(ctx context.Context, r *authorizationv1.SelfSubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SelfSubjectAccessReview, error)
}

// ErrNoAccess: RBAC does not let the sidecar read what the allowlist
// watches.
var ErrNoAccess = errors.New("RBAC does not allow the InferencePool watch")

// CheckAccess asks, before any watch starts, whether the caller may get,
// list and watch the pool and the pods of its namespace, and names every
// permission missing: without them the informers would retry their
// forbidden lists until the sync timeout, and say nothing clear.
func CheckAccess(ctx context.Context, rev AccessReviewer, cfg PoolConfig) error {
	type res struct{ group, resource string }
	var missing []string
	for _, r := range []res{{cfg.GVR().Group, cfg.GVR().Resource}, {PodsGVR.Group, PodsGVR.Resource}} {
		for _, verb := range []string{"get", "list", "watch"} {
			got, err := rev.Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: cfg.Namespace, Verb: verb, Group: r.group, Resource: r.resource},
			}}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("access review of %s %s: %w", verb, r.resource, err)
			}
			if !got.Status.Allowed {
				name := r.resource
				if r.group != "" {
					name += "." + r.group
				}
				missing = append(missing, verb+" "+name)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s in namespace %s (the chart's Role grants them: rbac.create; or deploy/rbac/ssrf-rbac.yaml)",
			ErrNoAccess, strings.Join(missing, ", "), cfg.Namespace)
	}
	return nil
}
