package enginesim

import "sync"

// The Responses API's conversation state, as vLLM keeps it (wirecorpus
// vllm-responses-unknown-previous-4d89a999, read at vllm-project/vllm
// 4d89a999 vllm/entrypoints/openai/responses/serving.py): an answered
// /v1/responses request whose store member is true (absent: true) is kept
// in the engine's memory under its response id, with the messages its
// prompt was made of and its output; a later request's
// previous_response_id names it, and its prompt is then the new request's
// instructions (a system message), the kept messages, the kept output as
// an assistant message, then the new input (construct_input_messages). An
// id the engine does not hold is answered 404 with vLLM's error body. So
// the conversation lives in the engine that answered, which in a split is
// the decode engine: a prefill leg's answer is not kept, since vLLM keeps
// it under its own random request_id that no client learns, while this
// engine's ids come from X-Request-Id, which a split's legs share.
//
// vLLM stores only with VLLM_ENABLE_RESPONSES_API_STORE=1 and never
// evicts; this engine stores by default (--responses-store, 0: off, every
// previous_response_id answered 404 as vLLM without the variable) and
// keeps at most that many responses, forgetting the oldest first.

// storedResponse is one kept answer.
type storedResponse struct {
	// messages are the conversation the answer was generated for.
	messages []Message
	// output is the answer's text.
	output string
}

// responseStore keeps answered responses by id, at most max of them.
type responseStore struct {
	max   int
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string // the ids kept, oldest first
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, byID: make(map[string]storedResponse)}
}

// get returns the response kept under id.
func (s *responseStore) get(id string) (storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	return r, ok
}

// put keeps r under id (replacing what id held), forgetting the oldest
// responses past max; it returns how many are kept.
func (s *responseStore) put(id string, r storedResponse) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max <= 0 {
		return 0
	}
	if _, ok := s.byID[id]; !ok {
		s.order = append(s.order, id)
	}
	s.byID[id] = r
	for len(s.order) > s.max {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
	return len(s.byID)
}

// notFoundError is vLLM's answer to a previous_response_id it does not
// hold (_make_not_found_error).
func notFoundError(id string) error {
	return &requestError{status: 404, typ: "invalid_request_error", param: "response_id",
		msg: "Response with id '" + id + "' not found."}
}

// withHistory makes the prompt of a Responses request that names a
// previous response: that response's messages and output before the
// request's own input. An unknown id is vLLM's 404.
func (s *Sim) withHistory(g *genRequest) error {
	if g.api != apiResponses || g.previousResponse == "" {
		return nil
	}
	prev, ok := s.responses.get(g.previousResponse)
	if !ok {
		s.m.previousResponses.WithLabelValues("unknown").Inc()
		return notFoundError(g.previousResponse)
	}
	s.m.previousResponses.WithLabelValues("found").Inc()
	msgs := make([]Message, 0, len(prev.messages)+len(g.messages)+2)
	if g.instructions != "" {
		msgs = append(msgs, Message{Role: "system", Content: g.instructions})
	}
	msgs = append(msgs, prev.messages...)
	msgs = append(msgs, Message{Role: "assistant", Content: prev.output})
	msgs = append(msgs, g.input...)
	g.messages = msgs
	g.prompt = Tokenize(ChatPrompt(msgs))
	return nil
}

// keepResponse keeps a finished Responses answer for a later
// previous_response_id, unless the request asked not to be stored or is a
// prefill leg (see above).
func (s *Sim) keepResponse(g *genRequest, leg legKind, o *output) {
	if g.api != apiResponses || !g.store || leg == legPrefill {
		return
	}
	n := s.responses.put(o.id, storedResponse{messages: g.messages, output: o.text()})
	s.m.responsesStored.Set(float64(n))
}
