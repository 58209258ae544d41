package usl

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrBadHeader is returned by ReadCSV when the first line is not the header
// "n,throughput".
var ErrBadHeader = errors.New("CSV header must be n,throughput")

// ErrBadNumber is returned by ReadCSV for a field that is not a finite number.
var ErrBadNumber = errors.New("bad number")

// ReadCSV reads points from CSV with the header "n,throughput" (case and surrounding
// spaces are ignored) and one point per line. Blank lines are skipped; extra columns
// are an error, so a file in some other layout is not silently misread.
func ReadCSV(r io.Reader) ([]Point, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 2
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%w: the input is empty", ErrBadHeader)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	if !strings.EqualFold(strings.TrimSpace(header[0]), "n") ||
		!strings.EqualFold(strings.TrimSpace(header[1]), "throughput") {
		return nil, fmt.Errorf("%w, got %q", ErrBadHeader, strings.Join(header, ","))
	}
	var points []Point
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return points, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read CSV: %w", err)
		}
		line, _ := cr.FieldPos(0)
		n, err := parseNumber(rec[0])
		if err != nil {
			return nil, fmt.Errorf("%w on line %d, column n: %q", ErrBadNumber, line, rec[0])
		}
		x, err := parseNumber(rec[1])
		if err != nil {
			return nil, fmt.Errorf("%w on line %d, column throughput: %q", ErrBadNumber, line, rec[1])
		}
		points = append(points, Point{N: n, X: x})
	}
}

// parseNumber parses a finite float.
func parseNumber(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, err
	}
	if v != v || v > 1e300 || v < -1e300 {
		return 0, errors.New("not finite")
	}
	return v, nil
}
