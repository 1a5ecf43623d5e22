// Command linearizability checks register histories recorded by `tutti chaos` with
// Porcupine (github.com/anishathalye/porcupine): per key, reads, writes and
// compare-and-swaps must be linearizable against a single 8-byte register that starts at 0.
//
// Usage: go run . [-timeout 10m] [-memory-mib 4096] [-visualize FILE.html] HISTORY.jsonl...
//
// Each file holds one JSON event per line: {"ev":"call","id","t","key","f",...} or
// {"ev":"return","id","t","out","value"}. An operation without a return, or that returned
// "unknown", may or may not have taken effect: it returns at the end of time and its
// effect is optional (Porcupine's convention). "aborted" operations took no effect and are
// left out, as are reads whose result is unknown. So is an unknown write or CAS whose value
// no operation observed (written values are unique): it can always be linearized at the end
// of time, where it changes nothing observed, and each one kept multiplies the search.
//
// Exit status: 0 linearizable, 1 not linearizable or not decided in time, 2 bad input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type event struct {
	Ev     string  `json:"ev"`
	ID     string  `json:"id"`
	T      int64   `json:"t"`
	Key    uint64  `json:"key"`
	F      string  `json:"f"`
	Value  *uint64 `json:"value"`
	Expect uint64  `json:"expect"`
	Out    string  `json:"out"`
}

type input struct {
	Key    uint64
	F      string
	Value  uint64
	Expect uint64
}

type output struct {
	Out   string // ok, mismatch or unknown
	Value uint64 // what a read returned
}

// The end of time: where operations that never returned are placed.
const never = math.MaxInt64

var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[uint64][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(input).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]uint64, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return uint64(0) },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		st, i, o := state.(uint64), in.(input), out.(output)
		switch i.F {
		case "read":
			return o.Value == st, st
		case "write":
			return true, i.Value
		case "cas":
			switch o.Out {
			case "ok":
				return st == i.Expect, i.Value
			case "mismatch":
				return st != i.Expect && st == o.Value, st
			default: // unknown: took effect iff the compare held
				if st == i.Expect {
					return true, i.Value
				}
				return true, st
			}
		}
		return false, st
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		switch i.F {
		case "read":
			return fmt.Sprintf("k%d read() -> %d", i.Key, o.Value)
		case "write":
			return fmt.Sprintf("k%d write(%d) -> %s", i.Key, i.Value, o.Out)
		default:
			return fmt.Sprintf("k%d cas(%d, %d) -> %s", i.Key, i.Expect, i.Value, o.Out)
		}
	},
	DescribeState: func(state interface{}) string { return fmt.Sprint(state.(uint64)) },
}

// History is what the files hold, as Porcupine operations.
type History struct {
	Ops        []porcupine.Operation
	Keys       int
	Unknown    int // operations kept with an unknown outcome
	Unobserved int // unknown writes and CASes left out: no one saw their value
	Dropped    int // aborted operations and reads without a result
}

// Load reads history files. A line that does not parse is allowed only as the last line of
// a file (a client killed while writing it): its operation never returned.
func Load(paths []string) (History, error) {
	type call struct {
		e    event
		proc int
	}
	calls := map[string]call{}
	returns := map[string]event{}
	procs := map[string]int{}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return History{}, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var bad string
		for line := 1; sc.Scan(); line++ {
			if bad != "" {
				f.Close()
				return History{}, fmt.Errorf("%s: %s", path, bad)
			}
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				bad = fmt.Sprintf("line %d: %v", line, err)
				continue
			}
			switch e.Ev {
			case "call":
				if _, dup := calls[e.ID]; dup {
					f.Close()
					return History{}, fmt.Errorf("%s: line %d: operation %s called twice", path, line, e.ID)
				}
				name := e.ID[:strings.LastIndexByte(e.ID, '.')+1]
				if _, ok := procs[name]; !ok {
					procs[name] = len(procs)
				}
				calls[e.ID] = call{e, procs[name]}
			case "return":
				returns[e.ID] = e
			default:
				f.Close()
				return History{}, fmt.Errorf("%s: line %d: unknown event %q", path, line, e.Ev)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return History{}, fmt.Errorf("%s: %v", path, err)
		}
	}
	// Values some operation saw in its key: read results, what a failed compare found,
	// what a successful CAS expected.
	observed := map[[2]uint64]bool{}
	for id, c := range calls {
		if r, ok := returns[id]; ok {
			switch {
			case r.Value != nil && (r.Out == "ok" || r.Out == "mismatch"):
				observed[[2]uint64{c.e.Key, *r.Value}] = true
			case c.e.F == "cas" && r.Out == "ok":
				observed[[2]uint64{c.e.Key, c.e.Expect}] = true
			}
		}
	}
	var h History
	keys := map[uint64]bool{}
	for id, c := range calls {
		in := input{Key: c.e.Key, F: c.e.F, Expect: c.e.Expect}
		if c.e.Value != nil {
			in.Value = *c.e.Value
		}
		out, end := output{Out: "unknown"}, int64(never)
		if r, ok := returns[id]; ok && r.Out != "unknown" {
			out.Out, end = r.Out, r.T
			if r.Value != nil {
				out.Value = *r.Value
			}
			if r.T < c.e.T {
				return History{}, fmt.Errorf("operation %s returns before its call", id)
			}
		}
		switch {
		case in.F != "read" && in.F != "write" && in.F != "cas":
			return History{}, fmt.Errorf("operation %s: unknown function %q", id, in.F)
		case out.Out == "aborted", in.F == "read" && out.Out != "ok":
			h.Dropped++
			continue
		case out.Out == "unknown" && !observed[[2]uint64{in.Key, in.Value}]:
			h.Unobserved++
			continue
		case out.Out == "unknown":
			h.Unknown++
		}
		keys[in.Key] = true
		h.Ops = append(h.Ops, porcupine.Operation{ClientId: c.proc, Input: in, Call: c.e.T, Output: out, Return: end})
	}
	h.Keys = len(keys)
	return h, nil
}

// What was checked, for the verdict line.
func describe(h History, started time.Time) string {
	return fmt.Sprintf("%d operations on %d keys (%d with unknown outcome; left out: %d unknown and unobserved, %d aborted or unread), checked in %.1f s",
		len(h.Ops), h.Keys, h.Unknown, h.Unobserved, h.Dropped, time.Since(started).Seconds())
}

// Exits undecided once the heap passes limitMiB, after asking the collector to keep under
// it as long as it can.
func watchMemory(limitMiB uint64, what func() string) {
	limit := limitMiB << 20
	debug.SetMemoryLimit(int64(limit))
	var m runtime.MemStats
	for {
		runtime.ReadMemStats(&m)
		if m.HeapAlloc > limit {
			fmt.Printf("undecided (the search's heap passed %d MiB): %s\n", limitMiB, what())
			os.Exit(1)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func main() {
	timeout := flag.Duration("timeout", 10*time.Minute, "give up (exit 1) after this long")
	memoryMiB := flag.Uint64("memory-mib", 4096, "give up (exit 1) once the search's heap passes this many MiB")
	visualize := flag.String("visualize", "", "write Porcupine's HTML visualization here when the history is not linearizable")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: linearizability [-timeout D] [-memory-mib N] [-visualize FILE.html] HISTORY.jsonl...")
		os.Exit(2)
	}
	h, err := Load(flag.Args())
	if err != nil {
		fmt.Println("bad history:", err)
		os.Exit(2)
	}
	started := time.Now()
	// A history with many operations of unknown outcome can make the search's state grow
	// without bound (15 GB in one chaos run): give up before the machine runs out.
	go watchMemory(*memoryMiB, func() string { return describe(h, started) })
	// The verbose check, which keeps partial linearizations for the visualization, is
	// several times slower: run it only to draw a history already found illegal.
	res := porcupine.CheckOperationsTimeout(model, h.Ops, *timeout)
	what := describe(h, started)
	switch res {
	case porcupine.Ok:
		fmt.Println("linearizable:", what)
	case porcupine.Illegal:
		if *visualize != "" {
			_, info := porcupine.CheckOperationsVerbose(model, h.Ops, *timeout)
			if err := porcupine.VisualizePath(model, info, *visualize); err == nil {
				what += "; visualization in " + *visualize
			}
		}
		fmt.Println("NOT linearizable:", what)
		os.Exit(1)
	default:
		fmt.Println("undecided (timed out):", what)
		os.Exit(1)
	}
}
