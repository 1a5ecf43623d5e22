package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

func check(t *testing.T, lines ...string) porcupine.CheckResult {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history-0-1.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Load([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	return porcupine.CheckOperationsTimeout(model, h.Ops, 0)
}

const (
	writeA   = `{"ev":"call","id":"a.1","t":10,"key":1,"f":"write","value":5}`
	writeAOk = `{"ev":"return","id":"a.1","t":20,"out":"ok"}`
	readB    = `{"ev":"call","id":"b.1","t":30,"key":1,"f":"read"}`
)

func TestReadAfterWriteSeesIt(t *testing.T) {
	if r := check(t, writeA, writeAOk, readB, `{"ev":"return","id":"b.1","t":40,"out":"ok","value":5}`); r != porcupine.Ok {
		t.Fatalf("got %v", r)
	}
}

func TestStaleReadIsCaught(t *testing.T) {
	if r := check(t, writeA, writeAOk, readB, `{"ev":"return","id":"b.1","t":40,"out":"ok","value":0}`); r != porcupine.Illegal {
		t.Fatalf("got %v", r)
	}
}

func TestUnreturnedWriteMayOrMayNotHaveHappened(t *testing.T) {
	for _, v := range []string{"0", "5"} {
		if r := check(t, writeA, readB, `{"ev":"return","id":"b.1","t":40,"out":"ok","value":`+v+`}`); r != porcupine.Ok {
			t.Fatalf("read %s: got %v", v, r)
		}
	}
}

func TestAbortedWriteMustNotBeSeen(t *testing.T) {
	if r := check(t, writeA, `{"ev":"return","id":"a.1","t":20,"out":"aborted"}`, readB,
		`{"ev":"return","id":"b.1","t":40,"out":"ok","value":5}`); r != porcupine.Illegal {
		t.Fatalf("got %v", r)
	}
}

func TestCasMismatchMustBeJustified(t *testing.T) {
	cas := `{"ev":"call","id":"b.1","t":30,"key":1,"f":"cas","expect":5,"value":7}`
	if r := check(t, writeA, writeAOk, cas, `{"ev":"return","id":"b.1","t":40,"out":"mismatch","value":5}`); r != porcupine.Illegal {
		t.Fatalf("mismatch although the key held 5: got %v", r)
	}
	if r := check(t, writeA, writeAOk, cas, `{"ev":"return","id":"b.1","t":40,"out":"mismatch","value":6}`); r != porcupine.Illegal {
		t.Fatalf("mismatch found 6, which no one wrote: got %v", r)
	}
	if r := check(t, writeA, cas, `{"ev":"return","id":"b.1","t":40,"out":"mismatch","value":0}`); r != porcupine.Ok {
		t.Fatalf("mismatch before the unreturned write: got %v", r)
	}
	if r := check(t, writeA, writeAOk, cas, `{"ev":"return","id":"b.1","t":40,"out":"ok"}`); r != porcupine.Ok {
		t.Fatalf("got %v", r)
	}
}

func TestUnknownWritesNoOneSawAreLeftOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	lines := writeA + "\n" + `{"ev":"call","id":"a.2","t":11,"key":1,"f":"write","value":6}` + "\n" +
		readB + "\n" + `{"ev":"return","id":"b.1","t":40,"out":"ok","value":6}` + "\n"
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Load([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Ops) != 2 || h.Unknown != 1 || h.Unobserved != 1 {
		t.Fatalf("kept %d ops, %d unknown, %d unobserved", len(h.Ops), h.Unknown, h.Unobserved)
	}
}

func TestTornLastLineIsAnUnreturnedOperation(t *testing.T) {
	if r := check(t, writeA, `{"ev":"ret`); r != porcupine.Ok {
		t.Fatalf("got %v", r)
	}
}
