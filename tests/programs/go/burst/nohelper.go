//go:build !helper

package main

func snapshot() {}
