package enginesim

import "strings"

// The chat template's two controls, as vLLM's chat API has them:
//
//   - add_generation_prompt (default true) ends the rendered prompt with the
//     assistant header "<|assistant|>\n", from which the answer is generated.
//   - continue_final_message (default false; with add_generation_prompt
//     true it is refused, as vLLM refuses it) leaves the final message, which
//     must be the assistant's, open: the prompt is the earlier messages, the
//     assistant header and the message's content with no closing newline,
//     and generation continues that message.
//
// The continued content is context (it counts in prompt_tokens) and it is
// output already made: a message of k tokens resumes generation at output
// position k, and the digest that seeds generation is the KV of the prompt
// before the content — exactly the prompt of the request without that
// message. So a decode cut into pieces, each continuing the message with the
// previous pieces' text, makes token for token the output of one request:
// GenerateToken(d, i) depends on the digest and the position only.

// chatPrompt sets the prompt of a chat request from its messages and the
// template controls of b.
func (g *genRequest) chatPrompt(msgs []Message, b *body) error {
	cont, err := optBool(b.ContinueFinalMessage, "continue_final_message")
	if err != nil {
		return err
	}
	addGen := true
	if !absent(b.AddGenerationPrompt) {
		if addGen, err = optBool(b.AddGenerationPrompt, "add_generation_prompt"); err != nil {
			return err
		}
	}
	if !cont {
		g.prompt = Tokenize(chatTemplate(msgs, addGen))
		return nil
	}
	last := msgs[len(msgs)-1]
	switch {
	case addGen:
		return badRequest("continue_final_message", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	case last.Role != "assistant":
		return badRequest("continue_final_message", "continue_final_message needs the final message to be the assistant's, got %q", last.Role)
	}
	g.prompt = Tokenize(chatTemplate(msgs[:len(msgs)-1], true))
	g.offset = len(Tokenize(last.Content))
	g.continued = true
	return nil
}

// chatTemplate renders messages as "<|role|>\ncontent\n" each, then, with
// genPrompt, the assistant header "<|assistant|>\n".
func chatTemplate(msgs []Message, genPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	if genPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}
