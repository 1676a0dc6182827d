// Two bursts of small objects, each held for a moment, then dropped and its
// memory handed back to the OS (debug.FreeOSMemory) before the next: RSS
// peaks twice, well before the recorder's first periodic snapshot, and
// ends low. It prints the
// objects of each burst and RSS at each peak (VmRSS, read by the program).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	_ "memgap.dev/go/memgap"
)

func vmRSS() string {
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:"))
		}
	}
	return "?"
}

// burst holds n objects of size bytes at once, each written.
func burst(n, size int) {
	objects := make([][]byte, n)
	for i := range objects {
		objects[i] = make([]byte, size)
		objects[i][size-1] = byte(i)
	}
	fmt.Printf("burst of %d x %d B, VmRSS %s\n", n, size, vmRSS())
	time.Sleep(1500 * time.Millisecond)
	objects = nil
	debug.FreeOSMemory()
}

func main() {
	hold := flag.Float64("hold", 1, "seconds to hold still after the bursts")
	flag.Parse()
	burst(200000, 512)
	time.Sleep(100 * time.Millisecond)
	burst(50000, 1024)
	fmt.Printf("after, VmRSS %s\n", vmRSS())
	time.Sleep(time.Duration(*hold * float64(time.Second)))
}
