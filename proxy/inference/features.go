package inference

import "github.com/valyala/fasthttp"

// Request features take part in every inference request at the points
// both serving paths (fasthttp's goroutine driver and the lane) pass
// through, in the order of the one list New registers them in
// (Proxy.features). A feature is a unit of its own: its files, its
// configuration, one registration line. It is asked once per inference
// request, when the request's prefiller is named and allowed (or none is
// named), with the request's head; what it does for that request is its
// featureUse, whose abilities are found by type assertion. A feature that
// needs a new point in the request adds an ability here, which both
// drivers consult; no driver knows a feature's name.

// requestFeature is a feature of inference requests.
type requestFeature interface {
	// begin returns the feature's part in request r, whose head is h
	// (nil: nothing to do for it). It may count and log; it must not
	// keep h, which the lane reuses for the next request.
	begin(r *Request, h *fasthttp.RequestHeader) featureUse
}

// featureUse is a feature's part in one request. Its abilities:
// splitDecliner, prefillEditor, localEditor.
type featureUse any

// splitDecliner serves a request that names a prefiller locally instead of
// splitting it (declinesSplit true); the feature counted and logged why.
type splitDecliner interface{ declinesSplit() bool }

// prefillEditor edits the body of the prefill leg (after the connector
// built it); an error fails the request as a bad request.
type prefillEditor interface {
	EditPrefill(body []byte) ([]byte, error)
}

// localEditor edits the body of a request the local engine prefills
// because none was split (no prefiller named, or the split declined); an
// error fails the request as a bad request. A fallback's local leg is
// the client's own body, unedited.
type localEditor interface {
	EditLocal(body []byte) ([]byte, error)
}

// BeginFeatures asks every feature for its part in r, whose head is h.
func (r *Request) BeginFeatures(h *fasthttp.RequestHeader) {
	for _, f := range r.P.features {
		if u := f.begin(r, h); u != nil {
			r.uses = append(r.uses, u)
		}
	}
}

// SplitDeclined reports whether a feature serves r locally instead of
// splitting it.
func (r *Request) SplitDeclined() bool {
	for _, u := range r.uses {
		if d, ok := u.(splitDecliner); ok && d.declinesSplit() {
			return true
		}
	}
	return false
}

// EditPrefill gives the prefill leg's body to every feature that edits it.
func (r *Request) EditPrefill(body []byte) ([]byte, error) {
	for _, u := range r.uses {
		if e, ok := u.(prefillEditor); ok {
			var err error
			if body, err = e.EditPrefill(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}

// EditLocal gives the body of a request served locally to every feature
// that edits it.
func (r *Request) EditLocal(body []byte) ([]byte, error) {
	for _, u := range r.uses {
		if e, ok := u.(localEditor); ok {
			var err error
			if body, err = e.EditLocal(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}
