package tokenizer_test

import (
	"fmt"
	"os"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/testmodel"
)

func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		fmt.Println(err)
		return
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	prompt, _ := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hi"}},
		tokenizer.ChatOptions{AddGenerationPrompt: true})
	fmt.Printf("%q\n", prompt)
	ids, _ := tok.Encode("The dog sleeps. STOP and more", false)
	dec := tok.NewStreamDecoder(nil, []string{"STOP"})
	out := ""
	for _, id := range ids {
		delta, stopped := dec.Add(id)
		out += delta
		if stopped {
			break
		}
	}
	fmt.Printf("%q\n", out+dec.Flush())
	// Output:
	// "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	// "The dog sleeps. "
}
