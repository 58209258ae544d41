package sqlexec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5/pgconn"
)

// Spool holds a whole answer's rows for a statement that must read them all before it
// writes (an INSERT ... SELECT whose rows go to other shards than the ones it reads).
// The first rows stay in memory; past spoolMemory bytes they go to a temporary file,
// which Close removes. Past limit bytes Append fails: no answer's size exhausts memory
// or disk.
type Spool struct {
	limit int64
	mem   bytes.Buffer
	file  *os.File
	w     *bufio.Writer
	r     *bufio.Reader
	rows  int64
	size  int64
	buf   []byte
}

// spoolMemory is how many bytes of rows a Spool keeps in memory.
const spoolMemory = 4 << 20

// ErrSpoolFull is returned by Append past the spool's limit.
var ErrSpoolFull = errors.New("sqlexec: the rows exceed the spool's limit")

// NewSpool returns an empty spool that holds at most limit bytes of values.
func NewSpool(limit int64) *Spool { return &Spool{limit: limit} }

// Append adds a row; nil values are NULL. The values are copied.
func (s *Spool) Append(row [][]byte) error {
	b := binary.AppendUvarint(s.buf[:0], uint64(len(row)))
	for _, v := range row {
		if v == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(v))+1)
		b = append(b, v...)
	}
	s.buf = b
	if s.size+int64(len(b)) > s.limit {
		return ErrSpoolFull
	}
	s.size += int64(len(b))
	s.rows++
	if s.file == nil && s.mem.Len()+len(b) <= spoolMemory {
		s.mem.Write(b)
		return nil
	}
	if s.file == nil {
		f, err := os.CreateTemp("", "shardlab-spool-*")
		if err != nil {
			return fmt.Errorf("sqlexec: spooling rows: %w", err)
		}
		s.file, s.w = f, bufio.NewWriterSize(f, 64<<10)
		if _, err := s.w.Write(s.mem.Bytes()); err != nil {
			return fmt.Errorf("sqlexec: spooling rows: %w", err)
		}
		s.mem = bytes.Buffer{}
	}
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("sqlexec: spooling rows: %w", err)
	}
	return nil
}

// Rows is the number of rows appended.
func (s *Spool) Rows() int64 { return s.rows }

// Size is the number of bytes the rows take.
func (s *Spool) Size() int64 { return s.size }

// Next reads the next n rows (fewer at the end), from the first. Appending ends with
// the first call.
func (s *Spool) Next(n int) ([][][]byte, error) {
	if s.r == nil {
		var src io.Reader = &s.mem
		if s.file != nil {
			if err := s.w.Flush(); err != nil {
				return nil, fmt.Errorf("sqlexec: spooling rows: %w", err)
			}
			if _, err := s.file.Seek(0, io.SeekStart); err != nil {
				return nil, fmt.Errorf("sqlexec: spooling rows: %w", err)
			}
			src = s.file
		}
		s.r = bufio.NewReaderSize(src, 64<<10)
	}
	var out [][][]byte
	for len(out) < n {
		cols, err := binary.ReadUvarint(s.r)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("sqlexec: reading spooled rows: %w", err)
		}
		row := make([][]byte, cols)
		for i := range row {
			l, err := binary.ReadUvarint(s.r)
			if err != nil {
				return nil, fmt.Errorf("sqlexec: reading spooled rows: %w", err)
			}
			if l == 0 {
				continue
			}
			row[i] = make([]byte, l-1)
			if _, err := io.ReadFull(s.r, row[i]); err != nil {
				return nil, fmt.Errorf("sqlexec: reading spooled rows: %w", err)
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// Close removes the spool's file, if it made one.
func (s *Spool) Close() {
	if s.file != nil {
		s.file.Close()
		os.Remove(s.file.Name())
		s.file = nil
	}
}

// SpoolAll reads the rest of rows into spool, and gives back their columns. rows is
// closed; past the spool's bound it is aborted (its shards stop) and the error is
// ErrSpoolFull.
func SpoolAll(rows *Rows, spool *Spool) ([]pgconn.FieldDescription, error) {
	defer rows.Close()
	for rows.Next() {
		if err := spool.Append(rows.Values()); err != nil {
			rows.Abort()
			return nil, err
		}
	}
	if _, err := rows.Close(); err != nil {
		return nil, err
	}
	return rows.Fields(), nil
}
