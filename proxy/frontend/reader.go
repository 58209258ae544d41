package frontend

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Startup packet codes (the first four bytes after the length).
const (
	codeSSLRequest    = 80877103
	codeGSSEncRequest = 80877104
	codeCancelRequest = 80877102
)

// MaxStartupPacket bounds the startup packet, as PostgreSQL does.
const MaxStartupPacket = 10000

// DefaultMaxMessage bounds one message from a client unless Options say otherwise.
const DefaultMaxMessage = 64 << 20

// ProtocolError is a message the proxy cannot accept: malformed, oversized, of an
// unknown type, or of a protocol version it does not speak. The client gets a FATAL
// error with Code and is disconnected.
type ProtocolError struct {
	Code    string
	Message string
}

func (e *ProtocolError) Error() string { return e.Message }

// SQLState returns the error's SQLSTATE.
func (e *ProtocolError) SQLState() string { return e.Code }

func protocolErr(format string, args ...any) error {
	return &ProtocolError{Code: "08P01", Message: fmt.Sprintf(format, args...)}
}

// Startup is a client's startup message, with what protocol version negotiation needs.
type Startup struct {
	Parameters map[string]string
	// Minor is the protocol's minor version the client asked for; the proxy speaks 3.0
	// and answers a higher one with NegotiateProtocolVersion.
	Minor uint32
	// Unrecognized lists protocol options (_pq_.*) the client sent; none is supported.
	Unrecognized []string
}

// Reader reads a client's messages: one startup packet (or SSL/GSS/cancel request),
// then typed messages, decoded with pgproto3. A decoded message is valid only until the
// next call.
type Reader struct {
	br   *bufio.Reader
	max  int
	body []byte

	bind     pgproto3.Bind
	close    pgproto3.Close
	describe pgproto3.Describe
	execute  pgproto3.Execute
	parse    pgproto3.Parse
	query    pgproto3.Query
	copyData pgproto3.CopyData
	copyDone pgproto3.CopyDone
	copyFail pgproto3.CopyFail
	sync     pgproto3.Sync
	flush    pgproto3.Flush
	term     pgproto3.Terminate
	fcall    pgproto3.FunctionCall
}

// NewReader returns a reader of r that refuses messages longer than maxMessage bytes
// (DefaultMaxMessage when 0).
func NewReader(r io.Reader, maxMessage int) *Reader {
	if maxMessage <= 0 {
		maxMessage = DefaultMaxMessage
	}
	return &Reader{br: bufio.NewReaderSize(r, 16<<10), max: maxMessage}
}

// Reset makes the reader read from r (after a TLS handshake), dropping nothing: the
// protocol says a client sends nothing after SSLRequest until it has the answer.
func (r *Reader) Reset(rd io.Reader) { r.br.Reset(rd) }

// Buffered reports whether bytes of the client's next message have arrived.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// NextType returns the type of the next message when its first byte has already
// arrived, without blocking.
func (r *Reader) NextType() (byte, bool) {
	if r.br.Buffered() == 0 {
		return 0, false
	}
	b, err := r.br.Peek(1)
	if err != nil {
		return 0, false
	}
	return b[0], true
}

// ReadStartup reads the first packet of a connection. It returns a *Startup, a
// *pgproto3.SSLRequest, a *pgproto3.GSSEncRequest or a *pgproto3.CancelRequest.
// A version other than 3.x gets a ProtocolError with SQLSTATE 0A000.
func (r *Reader) ReadStartup() (any, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r.br, hdr[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.BigEndian.Uint32(hdr[:])))
	if n < 8 || n > MaxStartupPacket {
		return nil, protocolErr("invalid length of startup packet: %d", n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r.br, body); err != nil {
		return nil, err
	}
	code := binary.BigEndian.Uint32(body)
	switch code {
	case codeSSLRequest:
		return &pgproto3.SSLRequest{}, nil
	case codeGSSEncRequest:
		return &pgproto3.GSSEncRequest{}, nil
	case codeCancelRequest:
		var m pgproto3.CancelRequest
		if err := m.Decode(body); err != nil {
			return nil, protocolErr("invalid cancel request: %v", err)
		}
		return &m, nil
	}
	major, minor := code>>16, code&0xffff
	if major != 3 {
		return nil, &ProtocolError{Code: "0A000",
			Message: fmt.Sprintf("unsupported frontend protocol %d.%d: server supports 3.0 to 3.0", major, minor)}
	}
	// Decode as 3.0: the proxy negotiates any later minor version down.
	binary.BigEndian.PutUint32(body, pgproto3.ProtocolVersion30)
	var m pgproto3.StartupMessage
	if err := m.Decode(body); err != nil {
		return nil, protocolErr("invalid startup packet layout: %v", err)
	}
	s := &Startup{Parameters: m.Parameters, Minor: minor}
	for k := range s.Parameters {
		if strings.HasPrefix(k, "_pq_.") {
			s.Unrecognized = append(s.Unrecognized, k)
			delete(s.Parameters, k)
		}
	}
	return s, nil
}

// next reads one typed message's type and body.
func (r *Reader) next() (byte, []byte, error) {
	hdr, err := r.br.Peek(5)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	typ := hdr[0]
	n := int(int32(binary.BigEndian.Uint32(hdr[1:])))
	if n < 4 {
		return 0, nil, protocolErr("invalid message length %d", n)
	}
	if n-4 > r.max {
		return 0, nil, protocolErr("message of %d bytes exceeds the proxy's limit of %d bytes", n-4, r.max)
	}
	r.br.Discard(5)
	size := n - 4
	if cap(r.body) < size {
		r.body = make([]byte, size)
	}
	body := r.body[:size]
	if _, err := io.ReadFull(r.br, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	if size > 1<<20 {
		r.body = nil // do not keep a large buffer for the connection's lifetime
	}
	return typ, body, nil
}

// Receive reads one typed message after startup.
func (r *Reader) Receive() (pgproto3.FrontendMessage, error) {
	typ, body, err := r.next()
	if err != nil {
		return nil, err
	}
	var msg pgproto3.FrontendMessage
	switch typ {
	case 'B':
		msg = &r.bind
	case 'C':
		msg = &r.close
	case 'D':
		msg = &r.describe
	case 'E':
		msg = &r.execute
	case 'P':
		msg = &r.parse
	case 'Q':
		msg = &r.query
	case 'd':
		msg = &r.copyData
	case 'c':
		msg = &r.copyDone
	case 'f':
		msg = &r.copyFail
	case 'S':
		msg = &r.sync
	case 'H':
		msg = &r.flush
	case 'X':
		msg = &r.term
	case 'F':
		msg = &r.fcall
	case 'p':
		return nil, protocolErr("unexpected password message")
	default:
		return nil, protocolErr("invalid frontend message type %d", typ)
	}
	if err := msg.Decode(body); err != nil {
		return nil, protocolErr("invalid %s message: %v", messageName(typ), err)
	}
	return msg, nil
}

// ReceiveSASL reads a SASL message of the authentication exchange: the initial
// response when initial, else a continuation.
func (r *Reader) ReceiveSASL(initial bool) (pgproto3.FrontendMessage, error) {
	typ, body, err := r.next()
	if err != nil {
		return nil, err
	}
	if typ != 'p' {
		return nil, protocolErr("expected SASL response, got message type %d", typ)
	}
	var msg pgproto3.FrontendMessage
	if initial {
		msg = &pgproto3.SASLInitialResponse{}
	} else {
		msg = &pgproto3.SASLResponse{}
	}
	if err := msg.Decode(body); err != nil {
		return nil, protocolErr("invalid SASL message: %v", err)
	}
	return msg, nil
}

func messageName(typ byte) string {
	switch typ {
	case 'B':
		return "Bind"
	case 'C':
		return "Close"
	case 'D':
		return "Describe"
	case 'E':
		return "Execute"
	case 'P':
		return "Parse"
	case 'Q':
		return "Query"
	case 'd':
		return "CopyData"
	case 'f':
		return "CopyFail"
	case 'F':
		return "FunctionCall"
	}
	return fmt.Sprintf("type %d", typ)
}
