package blockbench

import (
	"errors"
	"os"
)

// pendingFile is an output file written to path+".tmp" and renamed over path
// by commit, so a run that fails or is refused leaves an existing file as
// it was.
type pendingFile struct {
	*os.File
	path string
	done bool
}

func createPending(path string) (*pendingFile, error) {
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return nil, err
	}
	return &pendingFile{File: f, path: path}, nil
}

// commit closes the file and moves it into place. Only the first commit or
// discard does anything.
func (f *pendingFile) commit() error {
	if f.done {
		return nil
	}
	f.done = true
	if err := f.Close(); err != nil {
		return errors.Join(err, os.Remove(f.Name()))
	}
	return os.Rename(f.Name(), f.path)
}

// discard closes and removes the temporary file, leaving path untouched.
func (f *pendingFile) discard() {
	if f.done {
		return
	}
	f.done = true
	_ = f.Close()
	_ = os.Remove(f.Name())
}
