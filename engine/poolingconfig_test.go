package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const stModules = `[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
 {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}%s]`

const stNormalize = `,{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}`

func TestReadPooling(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		encoder bool
		want    PoolingConfig
		bad     string // a *CheckpointError is expected when set
	}{
		{name: "decoder default", files: map[string]string{"config.json": `{}`},
			want: PoolingConfig{Pooling: PoolLast, Normalize: true}},
		{name: "encoder default", encoder: true, files: map[string]string{"config.json": `{}`},
			want: PoolingConfig{Pooling: PoolMean, Normalize: true}},
		{name: "bge: cls normalized, max length", encoder: true, files: map[string]string{
			"config.json":               `{}`,
			"modules.json":              fmt.Sprintf(stModules, stNormalize),
			"1_Pooling/config.json":     `{"word_embedding_dimension":768,"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":false}`,
			"sentence_bert_config.json": `{"max_seq_length":512,"do_lower_case":true}`,
		}, want: PoolingConfig{Pooling: PoolCLS, Normalize: true, MaxLength: 512, Published: true}},
		{name: "minilm: mean, not normalized", encoder: true, files: map[string]string{
			"config.json":           `{}`,
			"modules.json":          fmt.Sprintf(stModules, ""),
			"1_Pooling/config.json": `{"pooling_mode_mean_tokens":true}`,
		}, want: PoolingConfig{Pooling: PoolMean, Published: true}},
		{name: "qwen3-embedding: lasttoken, matryoshka", files: map[string]string{
			"config.json":           `{"matryoshka_dimensions":[32,64,1024]}`,
			"modules.json":          fmt.Sprintf(stModules, stNormalize),
			"1_Pooling/config.json": `{"pooling_mode_lasttoken":true,"include_prompt":true}`,
		}, want: PoolingConfig{Pooling: PoolLast, Normalize: true, Published: true, Matryoshka: true, MatryoshkaDims: []int{32, 64, 1024}}},
		{name: "named mode", files: map[string]string{
			"config.json":           `{"is_matryoshka":true}`,
			"modules.json":          fmt.Sprintf(stModules, ""),
			"1_Pooling/config.json": `{"pooling_mode":"cls"}`,
		}, want: PoolingConfig{Pooling: PoolCLS, Published: true, Matryoshka: true}},
		{name: "max pooling", files: map[string]string{"config.json": `{}`, "modules.json": fmt.Sprintf(stModules, ""),
			"1_Pooling/config.json": `{"pooling_mode_max_tokens":true}`}, bad: "max"},
		{name: "two modes", files: map[string]string{"config.json": `{}`, "modules.json": fmt.Sprintf(stModules, ""),
			"1_Pooling/config.json": `{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":true}`}, bad: "2 pooling modes"},
		{name: "dense", files: map[string]string{"config.json": `{}`,
			"modules.json":          fmt.Sprintf(stModules, `,{"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.models.Dense"}`),
			"1_Pooling/config.json": `{"pooling_mode_mean_tokens":true}`}, bad: "Dense"},
		{name: "path escapes", files: map[string]string{"config.json": `{}`,
			"modules.json": `[{"idx":1,"name":"1","path":"../x","type":"sentence_transformers.models.Pooling"}]`}, bad: "leaves"},
		{name: "garbage modules", files: map[string]string{"config.json": `{}`, "modules.json": `{`}, bad: "module list"},
		{name: "no pooling", files: map[string]string{"config.json": `{}`,
			"modules.json": `[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"}]`}, bad: "no Pooling"},
		{name: "include_prompt false", files: map[string]string{"config.json": `{}`, "modules.json": fmt.Sprintf(stModules, ""),
			"1_Pooling/config.json": `{"pooling_mode_mean_tokens":true,"include_prompt":false}`}, bad: "include_prompt"},
		{name: "bad matryoshka", files: map[string]string{"config.json": `{"matryoshka_dimensions":[0]}`}, bad: "matryoshka"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadPooling(writeFiles(t, tc.files), tc.encoder)
			if tc.bad != "" {
				var ce *CheckpointError
				if !errors.As(err, &ce) || !errors.Is(err, ErrBadCheckpoint) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want a *CheckpointError about %q", err, tc.bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Pooling != tc.want.Pooling || got.Normalize != tc.want.Normalize || got.MaxLength != tc.want.MaxLength ||
				got.Published != tc.want.Published || got.Matryoshka != tc.want.Matryoshka || len(got.MatryoshkaDims) != len(tc.want.MatryoshkaDims) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPoolingString(t *testing.T) {
	for p, want := range map[Pooling]string{PoolNone: "none", PoolMean: "mean", PoolCLS: "cls", PoolLast: "lasttoken", 9: "Pooling(9)"} {
		if got := p.String(); got != want {
			t.Errorf("%d: %q, want %q", p, got, want)
		}
	}
}
