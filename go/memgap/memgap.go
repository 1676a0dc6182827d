// Package memgap reports the Go runtime's own memory figures to memgap (the
// profiler that explains why a process's RSS is far above the memory it
// holds) when `memgap run` started the program. Import it for its effect:
//
//	import _ "memgap.dev/go/memgap"
//
// and memgap's ledger splits the Go heap exactly (live objects, free slots
// in spans in use, free spans kept, released) from runtime/metrics, sampled
// at an interval: every /memory/classes/* metric, the allocs-by-size and
// frees-by-size histograms, GC cycles and goroutines. Snapshot asks memgap
// to record the process's memory at a point of the program's choosing.
//
// Without memgap as the parent (no MEMGAP_GO_METRICS in the environment)
// the package does nothing: no goroutine, no allocation, no file.
package memgap

import (
	"bufio"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The pipe memgap run passes: "WFD,RFD" (lines to memgap, answers from it).
const envPipe = "MEMGAP_GO_METRICS"
const envInterval = "MEMGAP_GO_INTERVAL_MS"

var (
	mu      sync.Mutex
	out     *bufio.Writer
	answers *os.File
	samples []metrics.Sample
	line    []byte
	acks    = make(chan struct{}, 16)
	gone    = make(chan struct{}) // closed when memgap's answers end
)

func init() {
	spec := os.Getenv(envPipe)
	if spec == "" {
		return
	}
	// Programs this one starts are not memgap's children.
	os.Unsetenv(envPipe)
	fds := strings.Split(spec, ",")
	if len(fds) != 2 {
		return
	}
	wfd, err1 := strconv.Atoi(fds[0])
	rfd, err2 := strconv.Atoi(fds[1])
	if err1 != nil || err2 != nil {
		return
	}
	syscall.CloseOnExec(wfd)
	syscall.CloseOnExec(rfd)
	out = bufio.NewWriterSize(os.NewFile(uintptr(wfd), "memgap"), 16<<10)
	answers = os.NewFile(uintptr(rfd), "memgap-answers")
	for _, name := range samplesFor() {
		samples = append(samples, metrics.Sample{Name: name})
	}
	interval := 100 * time.Millisecond
	if ms, err := strconv.Atoi(os.Getenv(envInterval)); err == nil && ms > 0 {
		interval = time.Duration(ms) * time.Millisecond
	}
	mu.Lock()
	out.WriteString("hello " + runtime.Version() + "\n")
	send()
	mu.Unlock()
	// memgap's answers: 's' asks for a sample now (it is about to take a
	// snapshot), 'k' says the snapshot Snapshot asked for is taken.
	go func() {
		defer close(gone)
		var b [1]byte
		for {
			if n, err := answers.Read(b[:]); err != nil || n == 0 {
				return
			}
			switch b[0] {
			case 's':
				mu.Lock()
				send()
				mu.Unlock()
			case 'k':
				acks <- struct{}{}
			}
		}
	}()
	go func() {
		for range time.Tick(interval) {
			mu.Lock()
			ok := send()
			mu.Unlock()
			if !ok {
				return
			}
		}
	}()
}

func wanted(name string) bool {
	return strings.HasPrefix(name, "/memory/classes/") ||
		strings.HasPrefix(name, "/gc/heap/allocs-by-size:") ||
		strings.HasPrefix(name, "/gc/heap/frees-by-size:") ||
		strings.HasPrefix(name, "/gc/cycles/") ||
		name == "/gc/heap/goal:bytes" ||
		name == "/gc/heap/objects:objects" ||
		name == "/sched/goroutines:goroutines"
}

// send writes one sample line; false once memgap has gone away. Called with mu held.
func send() bool {
	metrics.Read(samples)
	line = append(line[:0], "sample"...)
	for _, s := range samples {
		switch s.Value.Kind() {
		case metrics.KindUint64:
			line = appendValue(line, s.Name, float64(s.Value.Uint64()))
		case metrics.KindFloat64:
			line = appendValue(line, s.Name, s.Value.Float64())
		case metrics.KindFloat64Histogram:
			h := s.Value.Float64Histogram()
			// Bucket i is [Buckets[i], Buckets[i+1]): named by its upper bound.
			for i, count := range h.Counts {
				if count != 0 {
					line = appendValue(line, s.Name+"["+bound(h.Buckets[i+1])+"]", float64(count))
				}
			}
		}
	}
	line = append(line, '\n')
	if _, err := out.Write(line); err != nil {
		return false
	}
	return out.Flush() == nil
}

func bound(f float64) string {
	if f > 1e300 {
		return "inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func appendValue(line []byte, name string, v float64) []byte {
	line = append(line, ' ')
	line = append(line, name...)
	line = append(line, '=')
	return strconv.AppendFloat(line, v, 'f', -1, 64)
}

// Snapshot sends the runtime's figures now and asks memgap to record the
// process's memory (page residency of every mapping); it returns once
// memgap has. Without memgap as the parent it does nothing.
func Snapshot() {
	if out == nil {
		return
	}
	mu.Lock()
	ok := send()
	if ok {
		_, err := out.WriteString("snapshot\n")
		ok = err == nil && out.Flush() == nil
	}
	// Not held while waiting: the reader of memgap's answers may need it.
	mu.Unlock()
	if ok {
		select {
		case <-acks:
		case <-gone:
		}
	}
}

func samplesFor() []string {
	var names []string
	for _, d := range metrics.All() {
		if wanted(d.Name) {
			names = append(names, d.Name)
		}
	}
	return names
}
