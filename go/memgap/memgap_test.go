package memgap

import (
	"bufio"
	"os"
	"runtime/metrics"
	"strings"
	"testing"
)

func TestWantedMetricsExistInThisRuntime(t *testing.T) {
	found := map[string]bool{}
	for _, s := range []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes", "/memory/classes/heap/free:bytes",
		"/memory/classes/heap/released:bytes", "/gc/heap/allocs-by-size:bytes", "/gc/heap/frees-by-size:bytes", "/sched/goroutines:goroutines"} {
		found[s] = false
	}
	for _, s := range samplesFor() {
		if _, ok := found[s]; ok {
			found[s] = true
		}
	}
	for name, ok := range found {
		if !ok {
			t.Errorf("%s is not sampled", name)
		}
	}
}

func TestSampleLine(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out = bufio.NewWriter(w)
	samples = samples[:0]
	for _, name := range samplesFor() {
		samples = append(samples, metrics.Sample{Name: name})
	}
	mu.Lock()
	ok := send()
	mu.Unlock()
	w.Close()
	if !ok {
		t.Fatal("send failed")
	}
	text, _ := bufio.NewReader(r).ReadString('\n')
	if !strings.HasPrefix(text, "sample /") || !strings.Contains(text, " /memory/classes/heap/objects:bytes=") || !strings.Contains(text, "/gc/heap/allocs-by-size:bytes[") {
		t.Fatalf("unexpected line %q", text)
	}
	out = nil
}

func TestNothingWithoutMemgap(t *testing.T) {
	if os.Getenv(envPipe) == "" && out != nil {
		t.Fatal("the package started without memgap as the parent")
	}
	Snapshot() // returns at once
}
