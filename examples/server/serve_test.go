package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeScript runs the README's first command, scripts/serve.sh, as a
// new user would (with torch already installed by the set-up), and checks
// that it serves the Python engine, says so, says the generated model has
// random weights, answers a chat request and stops on SIGTERM.
func TestServeScript(t *testing.T) {
	testPython(t)
	if testing.Short() {
		t.Skip("builds and starts the server")
	}
	cmd := exec.Command("bash", "../../scripts/serve.sh", "-addr", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // go run's child too
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()

	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var log strings.Builder
	var addr string
	ready := false
	deadline := time.After(3 * time.Minute)
	for !ready {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("serve.sh exited:\n%s", log.String())
			}
			log.WriteString(line + "\n")
			if m := regexp.MustCompile(`msg=listening addr=(\S+)`).FindStringSubmatch(line); m != nil {
				addr = m[1]
			}
			ready = strings.Contains(line, "msg=serving")
		case <-deadline:
			t.Fatalf("serve.sh did not get ready:\n%s", log.String())
		}
	}
	for _, want := range []string{"engine started\" engine=pyproc", "msg=serving engine=pyproc model=tiny", "RANDOM weights"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, log.String())
		}
	}
	if strings.Contains(log.String(), "SIMULATED") {
		t.Errorf("serve.sh fell back to the simulated engine:\n%s", log.String())
	}
	c := &http.Client{Transport: &http.Transport{}, Timeout: time.Minute}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens"`) {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	// SIGTERM to the server (go run's child) stops it gracefully.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return // stderr closed: the server exited
			}
			log.WriteString(line + "\n")
		case <-ctx.Done():
			t.Fatalf("serve.sh did not stop on SIGTERM:\n%s", log.String())
		}
	}
}

// testPython returns the interpreter with torch that the set-up found
// ($MLXSERVING_PYTHON); without one the test is skipped, or fails under CI.
func testPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	return py
}
