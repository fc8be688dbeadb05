"""The three wire protocols (Chat Completions, Anthropic Messages, Responses) and what they share."""
