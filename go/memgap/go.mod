module memgap.dev/go/memgap

go 1.19
