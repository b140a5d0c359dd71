package prefillstrip

import "github.com/pd-sidecar/pd-sidecar/proxy/feature"

// Feature is --prefill-strip-headers as a request feature: the client's
// headers it names (lower case, Names) are left out of every leg sent to
// a prefiller, on both drivers (feature.PrefillHeadDropper). It takes no
// part of its own in a request.
type Feature struct{ Names []string }

// Begin implements feature.Feature: no per-request part.
func (Feature) Begin(feature.Request, feature.Head) feature.Use { return nil }

// PrefillDrops implements feature.PrefillHeadDropper.
func (f Feature) PrefillDrops() []string { return f.Names }
