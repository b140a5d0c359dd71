package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// api is one of the inference APIs the simulator serves.
type api int

const (
	apiCompletions api = iota
	apiChat
	apiResponses
	apiMessages
	apiGenerate
)

// requestError is a client error: it becomes an OpenAI-style error answer.
type requestError struct {
	status int
	typ    string
	param  string
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(param, format string, a ...any) error {
	return &requestError{status: 400, typ: "BadRequestError", param: param, msg: fmt.Sprintf(format, a...)}
}

// genRequest is an inference request after API-specific parsing.
type genRequest struct {
	api          api
	model        string
	prompt       []int
	maxTokens    int
	minTokens    int
	stream       bool
	includeUsage bool
	// kv is the request's kv_transfer_params (nil when absent or null).
	kv *kvParams
	// dpRank is the request's X-data-parallel-rank header ("" when none).
	dpRank string
	// mooncakeEngine is the engine id of the rank a Mooncake prefill ran
	// on (mooncake.go).
	mooncakeEngine string
	// kvRaw are kv_transfer_params' members as sent (nil when absent).
	kvRaw map[string]json.RawMessage
	// kvInvalid is set when kv_transfer_params was present but unusable.
	kvInvalid string
	// p2p are the OffloadingConnector P2P sub-dicts (nil when none).
	p2p  *p2pParams
	boot *bootstrap
	// cacheHitThreshold is cache_hit_threshold (0..1; 0 when absent).
	cacheHitThreshold float64
	// offset is, for a chat request continuing its final assistant message
	// (continue_final_message), the number of tokens that message already
	// holds: generation resumes at that output position (continue.go).
	offset int
	// continued marks a request with continue_final_message.
	continued bool
	// mm are the chat messages' multimodal items, ec the
	// ec_transfer_params entries by mm_hash (encoder.go).
	mm []mmItem
	ec map[string]ecRef
	// A Responses request's instructions and input, the conversation its
	// prompt renders (messages: with a previous response's, responses.go),
	// the previous_response_id it names ("": none) and its store member.
	instructions     string
	input, messages  []Message
	previousResponse string
	store            bool
}

// kvParams is vLLM NixlConnector's kv_transfer_params.
type kvParams struct {
	DoRemoteDecode  bool            `json:"do_remote_decode"`
	DoRemotePrefill bool            `json:"do_remote_prefill"`
	RemoteEngineID  *string         `json:"remote_engine_id"`
	RemoteRequestID *string         `json:"remote_request_id"`
	RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
	RemoteHost      *string         `json:"remote_host"`
	RemotePort      *int            `json:"remote_port"`
	TPSize          *int            `json:"tp_size"`
	// TransferID and RemoteBootstrapAddr are vLLM MooncakeConnector's.
	TransferID          *string `json:"transfer_id"`
	RemoteBootstrapAddr *string `json:"remote_bootstrap_addr"`
	// RemoteNotifyPort and RemoteDPRank are MoRI-IO write mode's
	// (moriio.go; its transfer_id is TransferID).
	RemoteNotifyPort *int `json:"remote_notify_port"`
	RemoteDPRank     *int `json:"remote_dp_rank"`
	// PullMode "sidecar" asks a prefiller for a kv_source descriptor.
	PullMode string `json:"pull_mode"`
	// Preloaded names blocks a sidecar already pulled into this engine.
	Preloaded *preloaded `json:"kv_preloaded"`
	// RemoteNumTokens, RemoteBlocksExpiryTime and TransferMode come with a
	// decode engine's pinned sequence (bidirectional.go): a prefill leg
	// that carries them with remote_request_id and remote_block_ids pulls
	// that history.
	RemoteNumTokens        *int     `json:"remote_num_tokens"`
	RemoteBlocksExpiryTime *float64 `json:"remote_blocks_expiry_time"`
	TransferMode           string   `json:"transfer_mode"`
}

// blockIDs flattens remote_block_ids: one list per KV group ([[...]], the
// first group is used) or a flat list (older vLLM).
func (p *kvParams) blockIDs() ([]int, error) {
	var groups [][]int
	if err := json.Unmarshal(p.RemoteBlockIDs, &groups); err == nil && len(groups) > 0 {
		return groups[0], nil
	}
	var flat []int
	if err := json.Unmarshal(p.RemoteBlockIDs, &flat); err != nil {
		return nil, fmt.Errorf("remote_block_ids: %w", err)
	}
	return flat, nil
}

// invalidForDecode reports why p cannot drive a remote-prefill decode, or
// "" when it can; nixl reads NIXL params.
func (p *kvParams) invalidForDecode(nixl func() string) string {
	if p.Preloaded != nil {
		if p.Preloaded.AllocID == "" || len(p.Preloaded.BlockIDs) == 0 {
			return "kv_preloaded needs alloc_id and block_ids"
		}
		return ""
	}
	if p.RemoteNotifyPort != nil {
		return p.invalidForMoriIO() // MoRI-IO write mode (moriio.go)
	}
	if p.TransferID != nil {
		return p.invalidForMooncake()
	}
	return nixl() // the wire shape's decode side (wireshape.go)
}

// bootstrap is SGLang's P/D addressing.
type bootstrap struct {
	host string
	port int
	room uint64
}

// body is the union of the fields the simulator reads, each kept raw so a
// wrong type gets a precise error.
type body struct {
	Model               json.RawMessage `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Input               json.RawMessage `json:"input"`
	Instructions        json.RawMessage `json:"instructions"`
	System              json.RawMessage `json:"system"`
	TokenIDs            json.RawMessage `json:"token_ids"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
	MinTokens           json.RawMessage `json:"min_tokens"`
	SamplingParams      json.RawMessage `json:"sampling_params"`
	Stream              json.RawMessage `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	N                   json.RawMessage `json:"n"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost       json.RawMessage `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage `json:"bootstrap_room"`
	CacheHitThreshold   json.RawMessage `json:"cache_hit_threshold"`
	// continue.go: chat template controls.
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ECTransferParams     json.RawMessage `json:"ec_transfer_params"`
	// responses.go: the Responses API's conversation state.
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Store              json.RawMessage `json:"store"`
}

func absent(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func optInt(raw json.RawMessage, name string) (int, bool, error) {
	if absent(raw) {
		return 0, false, nil
	}
	var v int
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, false, badRequest(name, "%s must be an integer", name)
	}
	return v, true, nil
}

func optBool(raw json.RawMessage, name string) (bool, error) {
	if absent(raw) {
		return false, nil
	}
	var v bool
	if err := json.Unmarshal(raw, &v); err != nil {
		return false, badRequest(name, "%s must be a boolean", name)
	}
	return v, nil
}

func optString(raw json.RawMessage, name string) (string, bool, error) {
	if absent(raw) {
		return "", false, nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false, badRequest(name, "%s must be a string", name)
	}
	return v, true, nil
}

// textOf reads content that is a string or a list of {type, text} parts.
func textOf(raw json.RawMessage, name string) (string, error) {
	if absent(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(name, "%s must be a string or a list of text parts", name)
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// messagesOf reads a list of messages. An assistant message that carries
// its reasoning back (reasoning_content, or reasoning) is rendered with the
// reasoning text followed by the content text, the order in which the
// engine generated them, so that a history that returns an answer whole
// extends the sequence its decode engine pinned (bidirectional.go), and one
// that strips the reasoning does not.
func messagesOf(raw json.RawMessage, name string) ([]Message, error) {
	var msgs []struct {
		Role             string          `json:"role"`
		Content          json.RawMessage `json:"content"`
		ReasoningContent json.RawMessage `json:"reasoning_content"`
		Reasoning        json.RawMessage `json:"reasoning"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest(name, "%s must be a list of messages", name)
	}
	if len(msgs) == 0 {
		return nil, badRequest(name, "%s must not be empty", name)
	}
	out := make([]Message, 0, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest(name, "%s[%d].role is required", name, i)
		}
		text, err := textOf(m.Content, fmt.Sprintf("%s[%d].content", name, i))
		if err != nil {
			return nil, err
		}
		if m.Role == "assistant" {
			field, raw := "reasoning_content", m.ReasoningContent
			if absent(raw) {
				field, raw = "reasoning", m.Reasoning
			}
			reasoning, err := textOf(raw, fmt.Sprintf("%s[%d].%s", name, i, field))
			if err != nil {
				return nil, err
			}
			text = reasoning + text
		}
		out = append(out, Message{Role: m.Role, Content: text})
	}
	return out, nil
}

// parseRequest turns a request body of the given API into a genRequest.
func parseRequest(a api, raw []byte, defaultMax int) (*genRequest, error) {
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field == "":
			return nil, badRequest("", "request body must be a JSON object")
		case errors.As(err, &syn):
			return nil, badRequest("", "malformed JSON: %v", err)
		default:
			return nil, badRequest("", "invalid request body: %v", err)
		}
	}
	g := &genRequest{api: a, maxTokens: defaultMax}
	model, ok, err := optString(b.Model, "model")
	if err != nil {
		return nil, err
	}
	if !ok && a != apiGenerate {
		return nil, badRequest("model", "model is required")
	}
	g.model = model
	if err := g.parsePrompt(a, &b); err != nil {
		return nil, err
	}
	if err := g.parseCaps(a, &b); err != nil {
		return nil, err
	}
	if g.stream, err = optBool(b.Stream, "stream"); err != nil {
		return nil, err
	}
	if !absent(b.StreamOptions) {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(b.StreamOptions, &so); err != nil {
			return nil, badRequest("stream_options", "stream_options must be an object")
		}
		g.includeUsage = so.IncludeUsage
	}
	if n, ok, err := optInt(b.N, "n"); err != nil {
		return nil, err
	} else if ok && n != 1 {
		return nil, badRequest("n", "the simulator serves n=1 only")
	}
	if !absent(b.KVTransferParams) {
		var p kvParams
		if err := json.Unmarshal(b.KVTransferParams, &p); err != nil {
			g.kvInvalid = "kv_transfer_params: " + err.Error()
		} else {
			g.kv = &p
			_ = json.Unmarshal(b.KVTransferParams, &g.kvRaw)
		}
		if g.p2p, err = parseP2P(b.KVTransferParams, g.kv); err != nil {
			return nil, err
		}
	}
	if err := g.parseThreshold(b.CacheHitThreshold); err != nil {
		return nil, err
	}
	return g, g.parseBootstrap(&b)
}

func (g *genRequest) parsePrompt(a api, b *body) error {
	switch a {
	case apiCompletions:
		if err := g.completionPrompt(b.Prompt); err != nil {
			return err
		}
	case apiChat:
		if absent(b.Messages) {
			return badRequest("messages", "messages is required")
		}
		msgs, err := messagesOf(b.Messages, "messages")
		if err != nil {
			return err
		}
		if err := g.chatPrompt(msgs, b); err != nil {
			return err
		}
		g.mm, g.ec = mmItemsOf(b.Messages), parseECParams(b.ECTransferParams) // encoder.go
	case apiResponses:
		if absent(b.Input) {
			return badRequest("input", "input is required")
		}
		if s, err := optStringOrNil(b.Instructions); err == nil {
			g.instructions = s
		}
		if s, ok, _ := optString(b.Input, "input"); ok {
			g.input = []Message{{Role: "user", Content: s}}
		} else {
			in, err := messagesOf(b.Input, "input")
			if err != nil {
				return err
			}
			g.input = in
		}
		if err := g.parseConversation(b); err != nil {
			return err
		}
		if g.instructions != "" {
			g.messages = append(g.messages, Message{Role: "system", Content: g.instructions})
		}
		g.messages = append(g.messages, g.input...)
		g.prompt = Tokenize(ChatPrompt(g.messages))
	case apiMessages:
		if absent(b.Messages) {
			return badRequest("messages", "messages is required")
		}
		var msgs []Message
		sys, err := textOf(b.System, "system")
		if err != nil {
			return err
		}
		if sys != "" {
			msgs = append(msgs, Message{Role: "system", Content: sys})
		}
		in, err := messagesOf(b.Messages, "messages")
		if err != nil {
			return err
		}
		g.prompt = Tokenize(ChatPrompt(append(msgs, in...)))
	case apiGenerate:
		if !absent(b.TokenIDs) {
			if err := json.Unmarshal(b.TokenIDs, &g.prompt); err != nil {
				return badRequest("token_ids", "token_ids must be a list of integers")
			}
		} else if err := g.completionPrompt(b.Prompt); err != nil {
			return badRequest("token_ids", "token_ids (or prompt) is required")
		}
	}
	if len(g.prompt) == 0 {
		return badRequest("prompt", "the prompt must not be empty")
	}
	return nil
}

// parseConversation reads a Responses request's previous_response_id
// (a string, or null for none) and store (absent: true; null: false, as
// vLLM's None; responses.go).
func (g *genRequest) parseConversation(b *body) error {
	id, _, err := optString(b.PreviousResponseID, "previous_response_id")
	if err != nil {
		return err
	}
	g.previousResponse = id
	g.store = len(b.Store) == 0
	if !g.store {
		if g.store, err = optBool(b.Store, "store"); err != nil {
			return err
		}
	}
	return nil
}

func optStringOrNil(raw json.RawMessage) (string, error) {
	s, _, err := optString(raw, "instructions")
	return s, err
}

func (g *genRequest) completionPrompt(raw json.RawMessage) error {
	if absent(raw) {
		return badRequest("prompt", "prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		g.prompt = Tokenize(s)
		return nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) == 1 {
		g.prompt = Tokenize(ss[0])
		return nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		g.prompt = ids
		return nil
	}
	return badRequest("prompt", "prompt must be a string, a list of one string, or a list of token ids")
}

func (g *genRequest) parseCaps(a api, b *body) error {
	type capField struct {
		raw  json.RawMessage
		name string
	}
	var caps []capField
	minRaw := b.MinTokens
	switch a {
	case apiCompletions, apiMessages:
		caps = []capField{{b.MaxTokens, "max_tokens"}}
	case apiChat:
		caps = []capField{{b.MaxTokens, "max_tokens"}, {b.MaxCompletionTokens, "max_completion_tokens"}}
	case apiResponses:
		caps = []capField{{b.MaxOutputTokens, "max_output_tokens"}}
	case apiGenerate:
		if !absent(b.SamplingParams) {
			var sp struct {
				MaxTokens json.RawMessage `json:"max_tokens"`
				MinTokens json.RawMessage `json:"min_tokens"`
			}
			if err := json.Unmarshal(b.SamplingParams, &sp); err != nil {
				return badRequest("sampling_params", "sampling_params must be an object")
			}
			caps = []capField{{sp.MaxTokens, "sampling_params.max_tokens"}}
			minRaw = sp.MinTokens
		}
	}
	set := false
	for _, c := range caps {
		v, ok, err := optInt(c.raw, c.name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if v < 1 {
			return badRequest(c.name, "%s must be at least 1, got %d", c.name, v)
		}
		if !set || v < g.maxTokens {
			g.maxTokens = v
		}
		set = true
	}
	minTokens, _, err := optInt(minRaw, "min_tokens")
	if err != nil {
		return err
	}
	if minTokens < 0 || minTokens > g.maxTokens {
		return badRequest("min_tokens", "min_tokens must be within 0..max_tokens (%d), got %d", g.maxTokens, minTokens)
	}
	g.minTokens = minTokens
	return nil
}

func (g *genRequest) parseBootstrap(b *body) error {
	if absent(b.BootstrapRoom) && absent(b.BootstrapHost) {
		return nil
	}
	host, _, err := optString(b.BootstrapHost, "bootstrap_host")
	if err != nil {
		return err
	}
	port, _, err := optInt(b.BootstrapPort, "bootstrap_port")
	if err != nil {
		return err
	}
	var room uint64
	if err := json.Unmarshal(b.BootstrapRoom, &room); err != nil {
		// Some clients send the room as a decimal string.
		s, _, serr := optString(b.BootstrapRoom, "bootstrap_room")
		if serr != nil {
			return badRequest("bootstrap_room", "bootstrap_room must be a non-negative integer")
		}
		if room, err = strconv.ParseUint(s, 10, 64); err != nil {
			return badRequest("bootstrap_room", "bootstrap_room must be a non-negative integer")
		}
	}
	if host == "" || port <= 0 {
		return badRequest("bootstrap_host", "bootstrap_host and bootstrap_port are required with bootstrap_room")
	}
	g.boot = &bootstrap{host: host, port: port, room: room}
	return nil
}
