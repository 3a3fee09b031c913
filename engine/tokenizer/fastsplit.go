package tokenizer

// fastSplitter returns a hand-written matcher for a known pre-tokenizer
// pattern, or nil to use the regular expression engine.
func fastSplitter(pattern string, behavior splitBehavior) func(dst []string, s string) []string {
	return nil
}
