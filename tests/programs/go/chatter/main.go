// chatter: one goroutine allocates 64 KiB slices (a GC every few ms)
// while the main goroutine writes its stderr in pieces: words without a
// newline, a line end every 37 words, and a last line without one.
// Its stderr is the same on every run.
package main

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
)

var sink [][]byte

func main() {
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		for !stop.Load() {
			sink = append(sink, make([]byte, 64<<10))
			if len(sink) > 200 {
				sink = sink[:0]
			}
		}
		close(done)
	}()
	for i := 0; i < 6000; i++ {
		fmt.Fprintf(os.Stderr, "p%d ", i)
		if i%37 == 36 {
			fmt.Fprintln(os.Stderr, "|")
		}
		// Three collections at least, however the allocating goroutine is scheduled.
		if i%2000 == 1000 {
			runtime.GC()
		}
	}
	stop.Store(true)
	<-done
	fmt.Fprint(os.Stderr, "end-without-newline")
}
