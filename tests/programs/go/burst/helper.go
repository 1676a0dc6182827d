//go:build helper

package main

import "memgap.dev/go/memgap"

func snapshot() { memgap.Snapshot() }
