// A small loopback HTTP service with net/http/pprof: it prints its port on
// stdout, then grows and shrinks a cache of small objects until killed.
package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"time"
)

type entry struct {
	key   int
	value [48]byte
}

var cache = map[int]*entry{}

func main() {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(listener.Addr().(*net.TCPAddr).Port)
	go http.Serve(listener, nil)
	for round := 0; ; round++ {
		for i := 0; i < 50000; i++ {
			e := &entry{key: i}
			e.value[0] = byte(round)
			cache[round*50000+i] = e
		}
		// Keep one entry in 64 of the older rounds.
		for key := range cache {
			if key < round*50000 && key%64 != 0 {
				delete(cache, key)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}
