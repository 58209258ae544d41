// Package server is the lab's HTTP front end: POST /insert and GET /get over a shard set,
// plus /healthz, /stats and /metrics, and the hot-row counter endpoints POST /counter/incr
// and GET /counter when a counter store is configured. Every client mistake gets a 4xx with a JSON body
// {"error": "..."}; a shard that fails gets a 503 naming the shard, and the other shards
// keep serving.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardlab/shardlab/counters"
	"github.com/shardlab/shardlab/lab/shardset"
)

// Limits on client input. They are part of the lab's documented interface (README).
const (
	MaxUserIDBytes = 128      // longest user_id accepted, in bytes of UTF-8
	MaxDataBytes   = 64 << 10 // longest data value accepted, in bytes (after JSON unescaping)
	// MaxBodyBytes is the longest request body read. JSON escaping can make a byte six
	// bytes long (\u0001), so the body limit leaves room for fully escaped values.
	MaxBodyBytes = 6*(MaxDataBytes+MaxUserIDBytes) + 1024
)

// Config describes what the server fronts.
type Config struct {
	Set     *shardset.Set
	Mode    string // "single" or "sharded", reported by /stats
	Backend string // "sqlite" or "postgres", reported by /stats
	// Settings reported by /stats so that load generators can record how the server ran.
	Sync          string // SQLite synchronous mode
	PoolSize      int    // connections per shard
	SQLiteVersion string // SQLite library version, when the backend is SQLite
	// Counter, when set, serves POST /counter/incr and GET /counter.
	Counter counters.Counter
	// Extra registers further routes (such as the counter endpoints) on the server's mux.
	Extra func(mux *http.ServeMux)
}

// Server is an http.Handler serving the lab's API.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	started time.Time

	stats struct {
		inserts, gets, getHits, getMisses, clientErrors, shardErrors atomic.Int64
	}
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Set == nil {
		return nil, errors.New("server: nil shard set")
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), started: time.Now(), registry: prometheus.NewRegistry()}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardlab_requests_total", Help: "HTTP requests by endpoint and status code.",
	}, []string{"endpoint", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "shardlab_request_duration_seconds",
		Help:    "Time to serve a request, by endpoint.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18), // 50us .. ~6.5s
	}, []string{"endpoint"})
	shardOps := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "shardlab_shard_errors_total", Help: "Requests that failed because a shard failed.",
	}, func() float64 { return float64(s.stats.shardErrors.Load()) })
	s.registry.MustRegister(s.requests, s.latency, shardOps,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.registry.MustRegister(rowsCollector{set: cfg.Set})

	s.handle("/insert", http.MethodPost, s.insert)
	s.handle("/get", http.MethodGet, s.get)
	s.handle("/healthz", http.MethodGet, s.healthz)
	s.handle("/stats", http.MethodGet, s.statsHandler)
	metrics := promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{})
	s.mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", http.MethodGet)
			WriteError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on /metrics; use GET", r.Method))
			return
		}
		metrics.ServeHTTP(w, r)
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s", r.URL.Path))
	})
	if cfg.Counter != nil {
		s.registerCounters()
	}
	if cfg.Extra != nil {
		cfg.Extra(s.mux)
	}
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Registry returns the Prometheus registry behind /metrics, for extra collectors.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// handle registers h for path, answering 405 with an Allow header for other methods, and
// records the request in the metrics.
func (s *Server) handle(path, method string, h func(w http.ResponseWriter, r *http.Request) int) {
	endpoint := strings.TrimPrefix(path, "/")
	m := &endpointMetrics{endpoint: endpoint, requests: s.requests, latencyVec: s.latency}
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var code int
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			code = WriteError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s; use %s", r.Method, path, method))
		} else {
			code = h(w, r)
		}
		// A 404 from /get is a miss, counted apart; every other 4xx is a client mistake.
		if code >= 400 && code < 500 && !(code == http.StatusNotFound && path == "/get") {
			s.stats.clientErrors.Add(1)
		}
		m.counter(code).Inc()
		m.observer().Observe(time.Since(start).Seconds())
	})
}

// endpointMetrics keeps one endpoint's children of the request metrics once they exist,
// so that a request does not look them up by label values (formatting the status code
// and hashing the labels) every time. A child is created on its first use, as
// WithLabelValues would, so /metrics shows only the series that have happened.
type endpointMetrics struct {
	endpoint   string
	requests   *prometheus.CounterVec
	latencyVec *prometheus.HistogramVec
	latency    atomic.Pointer[prometheus.Observer]
	byCode     [500]atomic.Pointer[prometheus.Counter] // status codes 100..599
}

func (m *endpointMetrics) counter(code int) prometheus.Counter {
	if code < 100 || code > 599 {
		return m.requests.WithLabelValues(m.endpoint, strconv.Itoa(code))
	}
	slot := &m.byCode[code-100]
	if c := slot.Load(); c != nil {
		return *c
	}
	c := m.requests.WithLabelValues(m.endpoint, strconv.Itoa(code)) // the same child every time
	slot.Store(&c)
	return c
}

func (m *endpointMetrics) observer() prometheus.Observer {
	if o := m.latency.Load(); o != nil {
		return *o
	}
	o := m.latencyVec.WithLabelValues(m.endpoint)
	m.latency.Store(&o)
	return o
}

// HandleJSON registers a JSON endpoint on mux with the server's method check and metrics;
// h returns the status code it wrote. It is how extra endpoints (counters) join the server.
func (s *Server) HandleJSON(path, method string, h func(w http.ResponseWriter, r *http.Request) int) {
	s.handle(path, method, h)
}

// WriteJSON writes v as a JSON response with the given status and returns the status.
func WriteJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) // the client may be gone; nothing useful to do then
	return status
}

// WriteError writes {"error": msg} with the given status and returns the status.
func WriteError(w http.ResponseWriter, status int, msg string) int {
	return WriteJSON(w, status, map[string]string{"error": msg})
}

// DecodeJSONBody reads a JSON object from r's body into dst with the lab's rules: the
// content type must be application/json, the body at most maxBytes and valid UTF-8, no
// unknown fields, nothing after the object. On failure it writes the 4xx response and
// returns its status; on success it returns 0.
func DecodeJSONBody(w http.ResponseWriter, r *http.Request, maxBytes int64, dst any) int {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return WriteError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return WriteError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type must be application/json, got %q", ct))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBytes))
		}
		return WriteError(w, http.StatusBadRequest, "cannot read request body: "+err.Error())
	}
	if !utf8.Valid(body) {
		// encoding/json would silently replace invalid bytes, breaking byte-for-byte storage.
		return WriteError(w, http.StatusBadRequest, "request body is not valid UTF-8")
	}
	if hasLoneSurrogate(body) {
		// The same goes for a \uD800-\uDFFF escape that is not half of a valid pair.
		return WriteError(w, http.StatusBadRequest, "malformed JSON: unpaired UTF-16 surrogate escape")
	}
	if msg := checkFieldNames(body, dst); msg != "" {
		return WriteError(w, http.StatusBadRequest, msg)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if errors.Is(err, io.EOF) {
			return WriteError(w, http.StatusBadRequest, "empty request body; want a JSON object")
		}
		return WriteError(w, http.StatusBadRequest, decodeErrorMessage(err))
	}
	if dec.More() {
		return WriteError(w, http.StatusBadRequest, "malformed JSON: unexpected data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return WriteError(w, http.StatusBadRequest, "malformed JSON: unexpected data after the object")
	}
	return 0
}

// decodeErrorMessage says what is wrong with a JSON body in the client's terms.
// encoding/json's own messages name Go types and struct fields ("cannot unmarshal number
// into Go struct field insertRequest.data of type string"), which mean nothing to a
// client and tell it about our code.
func decodeErrorMessage(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return "malformed JSON: want an object, got " + jsonValueText(typeErr.Value)
	case errors.As(err, &typeErr):
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, jsonTypeText(typeErr.Type), jsonValueText(typeErr.Value))
	case errors.As(err, &syntaxErr):
		// Its message ("invalid character 'x' after object key") is about JSON only.
		return fmt.Sprintf("malformed JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the body ends before the object does"
	}
	return "malformed JSON"
}

// jsonValueText names the kind of JSON value encoding/json reports in an
// UnmarshalTypeError's Value: "number", "number 1.5", "string", "bool", "array",
// "object".
func jsonValueText(v string) string {
	switch {
	case v == "bool":
		return "a boolean"
	case v == "array" || v == "object":
		return "an " + v
	case strings.HasPrefix(v, "number "):
		return "the number " + strings.TrimPrefix(v, "number ")
	case v == "number" || v == "string":
		return "a " + v
	}
	return "a JSON " + v
}

// jsonTypeText names, in JSON's words, what a Go field accepts.
func jsonTypeText(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonTypeText(t.Elem())
	}
	return "another type"
}

// hasLoneSurrogate reports whether a JSON text holds a \u escape of a UTF-16 surrogate
// that is not a high surrogate followed by a low one. encoding/json turns such escapes
// into U+FFFD, which would store something other than what was sent.
func hasLoneSurrogate(body []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range body[i+2 : i+6] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	inString := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			r, ok := hex4(i)
			if !ok {
				i++ // a two-character escape such as \" or \\
				continue
			}
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				if low, ok := hex4(i + 6); ok && low >= 0xDC00 && low <= 0xDFFF {
					i += 11
					continue
				}
				return true
			case r >= 0xDC00 && r <= 0xDFFF:
				return true
			}
			i += 5
		}
	}
	return false
}

// checkFieldNames walks the top-level object of a JSON body and returns a message when a
// field name is not one of dst's JSON field names exactly (encoding/json would match it
// case-insensitively) or appears twice (encoding/json would keep the last). It returns ""
// when the names are fine or the body is not an object (the decoder then says why).
func checkFieldNames(body []byte, dst any) string {
	allowed := map[string]bool{}
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return ""
	}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			allowed[name] = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := tok.(string)
		switch {
		case !allowed[name]:
			return fmt.Sprintf("unknown field %q", name)
		case seen[name]:
			return fmt.Sprintf("field %q given twice", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
	return ""
}

// ErrBadUserID is wrapped by ValidateUserID's errors.
var ErrBadUserID = errors.New("bad user_id")

// ValidateUserID checks a user id against the lab's rules: present, 1..MaxUserIDBytes
// bytes, no control characters.
func ValidateUserID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: user_id is required and must not be empty", ErrBadUserID)
	case len(id) > MaxUserIDBytes:
		return fmt.Errorf("%w: user_id is %d bytes, at most %d allowed", ErrBadUserID, len(id), MaxUserIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: user_id is not valid UTF-8", ErrBadUserID)
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: user_id contains a control character", ErrBadUserID)
		}
	}
	return nil
}

// insertRequest is the body of POST /insert. Pointers tell a missing field from an empty one.
type insertRequest struct {
	UserID *string `json:"user_id"`
	Data   *string `json:"data"`
}

// insertResponse is the body of a successful POST /insert.
type insertResponse struct {
	UserID string `json:"user_id"`
	Shard  int    `json:"shard"`
	Status string `json:"status"`
}

func (s *Server) insert(w http.ResponseWriter, r *http.Request) int {
	s.stats.inserts.Add(1)
	var req insertRequest
	if code := DecodeJSONBody(w, r, MaxBodyBytes, &req); code != 0 {
		return code
	}
	if req.UserID == nil {
		return WriteError(w, http.StatusBadRequest, "user_id is required")
	}
	if err := ValidateUserID(*req.UserID); err != nil {
		return WriteError(w, http.StatusBadRequest, err.Error())
	}
	if req.Data == nil {
		return WriteError(w, http.StatusBadRequest, "data is required (it may be an empty string)")
	}
	if len(*req.Data) > MaxDataBytes {
		return WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("data is %d bytes, at most %d allowed", len(*req.Data), MaxDataBytes))
	}
	shard, err := s.cfg.Set.Put(r.Context(), *req.UserID, []byte(*req.Data))
	if err != nil {
		return s.shardFailure(w, r, shard, err)
	}
	return WriteJSON(w, http.StatusOK, insertResponse{UserID: *req.UserID, Shard: shard, Status: "stored"})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) int {
	s.stats.gets.Add(1)
	id, ok := onlyUserID(r.URL.RawQuery)
	if !ok {
		q := r.URL.Query()
		ids, ok := q["user_id"]
		if !ok {
			return WriteError(w, http.StatusBadRequest, "query parameter user_id is required")
		}
		if len(ids) != 1 {
			return WriteError(w, http.StatusBadRequest, "give user_id exactly once")
		}
		for k := range q {
			if k != "user_id" {
				return WriteError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q", k))
			}
		}
		id = ids[0]
	}
	if err := ValidateUserID(id); err != nil {
		return WriteError(w, http.StatusBadRequest, err.Error())
	}
	data, shard, err := s.cfg.Set.Get(r.Context(), id)
	if errors.Is(err, shardset.ErrNotFound) {
		s.stats.getMisses.Add(1)
		return WriteJSON(w, http.StatusNotFound, map[string]any{"error": "user_id not found", "user_id": id, "shard": shard})
	}
	if err != nil {
		return s.shardFailure(w, r, shard, err)
	}
	s.stats.getHits.Add(1)
	return writeRecord(w, id, data, shard)
}

// onlyUserID reads the common query string of /get, "user_id=<value>" alone, without
// building url.Values. It answers false for anything else (another or a repeated
// parameter, a ';', an escaped name, a bad escape), which the general path then judges,
// so that both paths accept and refuse the same queries.
func onlyUserID(rawQuery string) (string, bool) {
	v, ok := strings.CutPrefix(rawQuery, "user_id=")
	if !ok || strings.ContainsAny(v, "&;") {
		return "", false
	}
	id, err := url.QueryUnescape(v)
	if err != nil {
		return "", false
	}
	return id, true
}

// recordBuffers holds the buffers writeRecord encodes into.
var recordBuffers = sync.Pool{New: func() any { return new([]byte) }}

// writeRecord writes the 200 answer of /get, {"user_id": id, "data": data, "shard":
// shard}, byte for byte what WriteJSON writes for a struct of those three fields, without
// encoding/json's reflection and allocations: it is the response of the lab's hottest
// path. A fuzz test compares the two on every kind of string.
func writeRecord(w http.ResponseWriter, id string, data []byte, shard int) int {
	bp := recordBuffers.Get().(*[]byte)
	b := append((*bp)[:0], `{"user_id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"data":`...)
	b = appendJSONString(b, data)
	b = append(b, `,"shard":`...)
	b = strconv.AppendInt(b, int64(shard), 10)
	b = append(b, "}\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	w.Write(b) // the client may be gone; nothing useful to do then
	if cap(b) <= 64<<10 {
		*bp = b
		recordBuffers.Put(bp)
	}
	return http.StatusOK
}

// jsonContentType is the Content-Type header value of JSON answers, shared read-only.
var jsonContentType = []string{"application/json"}

// appendJSONString appends s as a JSON string the way encoding/json's Encoder writes it
// (HTML escaping on, as by default): '"' and '\\' escaped, control characters as \b,
// \f, \n, \r, \t or \u00XX, '<', '>' and '&' as \u003c, \u003e and \u0026, U+2028
// and U+2029 escaped, and each byte of invalid UTF-8 as \ufffd.
func appendJSONString[S string | []byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune([]byte(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// shardFailure answers a request whose shard failed: 503 naming the shard, so clients can
// tell a dead shard from a bad request. A request cancelled by its client is not the
// shard's fault.
func (s *Server) shardFailure(w http.ResponseWriter, r *http.Request, shard int, err error) int {
	if r.Context().Err() != nil {
		return WriteError(w, 499, "request cancelled by the client")
	}
	s.stats.shardErrors.Add(1)
	return WriteJSON(w, http.StatusServiceUnavailable, map[string]any{
		"error": fmt.Sprintf("shard %d unavailable: %v", shard, errors.Unwrap(err)),
		"shard": shard,
	})
}

// shardHealth is one shard's entry in /healthz.
type shardHealth struct {
	Shard int    `json:"shard"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	health := s.cfg.Set.Health(ctx)
	shards := make([]shardHealth, len(health))
	var unhealthy []int
	for i, err := range health {
		shards[i] = shardHealth{Shard: i, OK: err == nil}
		if err != nil {
			shards[i].Error = err.Error()
			unhealthy = append(unhealthy, i)
		}
	}
	body := map[string]any{"status": "ok", "shards": shards}
	if len(unhealthy) > 0 {
		body["status"] = "degraded"
		body["unhealthy_shards"] = unhealthy
		return WriteJSON(w, http.StatusServiceUnavailable, body)
	}
	return WriteJSON(w, http.StatusOK, body)
}

// Stats is the body of GET /stats.
type Stats struct {
	Mode         string           `json:"mode"`
	Backend      string           `json:"backend"`
	Router       string           `json:"router"`
	Shards       int              `json:"shards"`
	RowsPerShard []int64          `json:"rows_per_shard"`
	Requests     map[string]int64 `json:"requests"`
	UptimeS      float64          `json:"uptime_s"`
	Sync         string           `json:"sync,omitempty"`
	PoolSize     int              `json:"pool_size,omitempty"`
	SQLiteVer    string           `json:"sqlite_version,omitempty"`
	Errors       []string         `json:"errors,omitempty"`
}

func (s *Server) statsHandler(w http.ResponseWriter, r *http.Request) int {
	counts, err := s.cfg.Set.Counts(r.Context())
	st := Stats{
		Mode: s.cfg.Mode, Backend: s.cfg.Backend, Router: s.cfg.Set.Router().Name(),
		Shards: s.cfg.Set.Shards(), RowsPerShard: counts, UptimeS: time.Since(s.started).Seconds(),
		Sync: s.cfg.Sync, PoolSize: s.cfg.PoolSize, SQLiteVer: s.cfg.SQLiteVersion,
		Requests: map[string]int64{
			"insert": s.stats.inserts.Load(), "get": s.stats.gets.Load(),
			"get_hits": s.stats.getHits.Load(), "get_misses": s.stats.getMisses.Load(),
			"client_errors": s.stats.clientErrors.Load(), "shard_errors": s.stats.shardErrors.Load(),
		},
	}
	if err != nil {
		st.Errors = strings.Split(err.Error(), "\n")
	}
	return WriteJSON(w, http.StatusOK, st)
}

// rowsCollector exports the records per shard, counted once per scrape.
type rowsCollector struct{ set *shardset.Set }

var rowsDesc = prometheus.NewDesc("shardlab_shard_rows",
	"Records stored in a shard, counted at scrape time (-1 when the shard fails).", []string{"shard"}, nil)

// Describe implements prometheus.Collector.
func (c rowsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rowsDesc }

// Collect implements prometheus.Collector.
func (c rowsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, _ := c.set.Counts(ctx)
	for i, n := range counts {
		ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(n), fmt.Sprint(i))
	}
}
