package sqlexec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// numeric is a PostgreSQL numeric: value = int / 10^scale, with scale the display scale
// (dscale), or one of the special values NaN, +Infinity, -Infinity. Merges add numerics
// and divide them exactly as PostgreSQL does, so that sum() and avg() across shards
// print the digits one database would print.
type numeric struct {
	int     *big.Int
	scale   int
	special int8 // 0, specialNaN, specialPosInf, specialNegInf
}

const (
	specialNaN    = 1
	specialPosInf = 2
	specialNegInf = 3
)

// Binary numeric sign words (numeric_send).
const (
	numericPos    = 0x0000
	numericNeg    = 0x4000
	numericNaN    = 0xC000
	numericPInf   = 0xD000
	numericNInf   = 0xF000
	numericBase   = 10000
	decDigits     = 4
	minSigDigits  = 16   // NUMERIC_MIN_SIG_DIGITS
	maxDispScale  = 1000 // NUMERIC_MAX_DISPLAY_SCALE
	minDispScale  = 0    // NUMERIC_MIN_DISPLAY_SCALE
	maxNumericLen = 1 << 16
)

var errBadNumeric = errors.New("sqlexec: malformed numeric value")

// parseNumericText reads numeric_out's text: [-]digits[.digits], NaN, Infinity, -Infinity.
func parseNumericText(s string) (numeric, error) {
	switch s {
	case "NaN":
		return numeric{special: specialNaN}, nil
	case "Infinity":
		return numeric{special: specialPosInf}, nil
	case "-Infinity":
		return numeric{special: specialNegInf}, nil
	}
	neg := strings.HasPrefix(s, "-")
	body := strings.TrimPrefix(s, "-")
	intPart, frac, _ := strings.Cut(body, ".")
	digits := intPart + frac
	if digits == "" || strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return numeric{}, fmt.Errorf("%w: %q", errBadNumeric, s)
	}
	v, ok := new(big.Int).SetString(digits, 10)
	if !ok {
		return numeric{}, fmt.Errorf("%w: %q", errBadNumeric, s)
	}
	if neg {
		v.Neg(v)
	}
	return numeric{int: v, scale: len(frac)}, nil
}

// text prints n as numeric_out does: every digit of its display scale.
func (n numeric) text() string {
	switch n.special {
	case specialNaN:
		return "NaN"
	case specialPosInf:
		return "Infinity"
	case specialNegInf:
		return "-Infinity"
	}
	s := new(big.Int).Abs(n.int).String()
	if n.scale > 0 {
		if len(s) <= n.scale {
			s = strings.Repeat("0", n.scale-len(s)+1) + s
		}
		s = s[:len(s)-n.scale] + "." + s[len(s)-n.scale:]
	}
	if n.int.Sign() < 0 {
		s = "-" + s
	}
	return s
}

// parseNumericBinary reads numeric_send's format: ndigits, weight, sign, dscale (int16
// each), then ndigits base-10000 digits.
func parseNumericBinary(b []byte) (numeric, error) {
	if len(b) < 8 {
		return numeric{}, errBadNumeric
	}
	ndigits := int(binary.BigEndian.Uint16(b))
	weight := int(int16(binary.BigEndian.Uint16(b[2:])))
	sign := binary.BigEndian.Uint16(b[4:])
	dscale := int(binary.BigEndian.Uint16(b[6:]))
	switch sign {
	case numericNaN:
		return numeric{special: specialNaN}, nil
	case numericPInf:
		return numeric{special: specialPosInf}, nil
	case numericNInf:
		return numeric{special: specialNegInf}, nil
	case numericPos, numericNeg:
	default:
		return numeric{}, errBadNumeric
	}
	if len(b) != 8+2*ndigits {
		return numeric{}, errBadNumeric
	}
	// value = sum(d_i * 10000^(weight-i)); scale it to dscale decimal digits.
	v := new(big.Int)
	base := big.NewInt(numericBase)
	for i := range ndigits {
		v.Mul(v, base)
		v.Add(v, big.NewInt(int64(binary.BigEndian.Uint16(b[8+2*i:]))))
	}
	// v now has (ndigits-1-weight)*4 decimal places.
	places := (ndigits - 1 - weight) * decDigits
	switch {
	case places < dscale:
		v.Mul(v, pow10(dscale-places))
	case places > dscale:
		// Digits past the display scale are zeros in a well-formed value.
		v.Quo(v, pow10(places-dscale))
	}
	if sign == numericNeg {
		v.Neg(v)
	}
	return numeric{int: v, scale: dscale}, nil
}

// binary prints n as numeric_send does: digits stripped of leading and trailing zero
// groups, the weight of the first, and the display scale.
func (n numeric) binary() []byte {
	hdr := func(ndigits, weight int, sign uint16, dscale int) []byte {
		b := make([]byte, 8, 8+2*ndigits)
		binary.BigEndian.PutUint16(b, uint16(ndigits))
		binary.BigEndian.PutUint16(b[2:], uint16(int16(weight)))
		binary.BigEndian.PutUint16(b[4:], sign)
		binary.BigEndian.PutUint16(b[6:], uint16(dscale))
		return b
	}
	switch n.special {
	case specialNaN:
		return hdr(0, 0, numericNaN, 0)
	case specialPosInf:
		return hdr(0, 0, numericPInf, 0)
	case specialNegInf:
		return hdr(0, 0, numericNInf, 0)
	}
	sign := uint16(numericPos)
	if n.int.Sign() < 0 {
		sign = numericNeg
	}
	if n.int.Sign() == 0 {
		return hdr(0, 0, numericPos, n.scale)
	}
	// Align the fraction to whole groups of 4 decimal digits.
	abs := new(big.Int).Abs(n.int)
	fracGroups := (n.scale + decDigits - 1) / decDigits
	abs.Mul(abs, pow10(fracGroups*decDigits-n.scale))
	var groups []uint16 // least significant first
	base := big.NewInt(numericBase)
	mod := new(big.Int)
	for abs.Sign() > 0 {
		abs.QuoRem(abs, base, mod)
		groups = append(groups, uint16(mod.Int64()))
	}
	// groups[k] has weight k - fracGroups.
	lo := 0
	for lo < len(groups) && groups[lo] == 0 {
		lo++
	}
	hi := len(groups) - 1
	weight := hi - fracGroups
	digits := groups[lo : hi+1]
	b := hdr(len(digits), weight, sign, n.scale)
	for i := len(digits) - 1; i >= 0; i-- {
		b = binary.BigEndian.AppendUint16(b, digits[i])
	}
	return b
}

func pow10(n int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n)), nil) }

// addNumeric adds as numeric_add does: the display scale is the larger one; NaN wins,
// and +Infinity plus -Infinity is NaN.
func addNumeric(a, b numeric) numeric {
	if a.special != 0 || b.special != 0 {
		switch {
		case a.special == specialNaN || b.special == specialNaN:
			return numeric{special: specialNaN}
		case a.special != 0 && b.special != 0 && a.special != b.special:
			return numeric{special: specialNaN}
		case a.special != 0:
			return a
		default:
			return b
		}
	}
	scale := max(a.scale, b.scale)
	x := new(big.Int).Mul(a.int, pow10(scale-a.scale))
	y := new(big.Int).Mul(b.int, pow10(scale-b.scale))
	return numeric{int: x.Add(x, y), scale: scale}
}

// weightAndFirstDigit returns the base-10000 weight and first non-zero digit of |n|,
// as PostgreSQL's NumericVar holds them (0, 0 for zero).
func weightAndFirstDigit(n numeric) (int, int) {
	if n.int.Sign() == 0 {
		return 0, 0
	}
	abs := new(big.Int).Abs(n.int)
	fracGroups := (n.scale + decDigits - 1) / decDigits
	abs.Mul(abs, pow10(fracGroups*decDigits-n.scale))
	s := abs.String()
	// Pad to whole groups, then the first group is the most significant digit.
	if pad := len(s) % decDigits; pad != 0 {
		s = strings.Repeat("0", decDigits-pad) + s
	}
	groups := len(s) / decDigits
	first := 0
	fmt.Sscanf(s[:decDigits], "%d", &first)
	return groups - 1 - fracGroups, first
}

// divNumeric divides as numeric_div does: the result scale from select_div_scale, the
// quotient rounded half away from zero at that scale. The divisor must not be zero.
func divNumeric(a, b numeric) numeric {
	if a.special != 0 || b.special != 0 {
		// Only avg uses this, with a finite count for b: Infinity / n keeps its sign.
		if a.special == specialNaN || b.special != 0 {
			return numeric{special: specialNaN}
		}
		if b.int.Sign() < 0 {
			if a.special == specialPosInf {
				return numeric{special: specialNegInf}
			}
			return numeric{special: specialPosInf}
		}
		return a
	}
	w1, f1 := weightAndFirstDigit(a)
	w2, f2 := weightAndFirstDigit(b)
	qweight := w1 - w2
	if f1 <= f2 {
		qweight--
	}
	rscale := minSigDigits - qweight*decDigits
	rscale = max(rscale, a.scale, b.scale, minDispScale)
	rscale = min(rscale, maxDispScale)
	// q = a/b * 10^rscale = a.int * 10^(rscale - a.scale + b.scale) / b.int
	num := new(big.Int).Set(a.int)
	den := new(big.Int).Set(b.int)
	if e := rscale - a.scale + b.scale; e >= 0 {
		num.Mul(num, pow10(e))
	} else {
		den.Mul(den, pow10(-e))
	}
	neg := (num.Sign() < 0) != (den.Sign() < 0)
	num.Abs(num)
	den.Abs(den)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Lsh(r, 1).Cmp(den) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if neg {
		q.Neg(q)
	}
	return numeric{int: q, scale: rscale}
}

// cmpNumeric orders numerics as PostgreSQL does: -Infinity < numbers < Infinity < NaN.
func cmpNumeric(a, b numeric) int {
	rank := func(n numeric) int {
		switch n.special {
		case specialNegInf:
			return 0
		case specialPosInf:
			return 2
		case specialNaN:
			return 3
		}
		return 1
	}
	ra, rb := rank(a), rank(b)
	if ra != rb || ra != 1 {
		return ra - rb
	}
	scale := max(a.scale, b.scale)
	x := new(big.Int).Mul(a.int, pow10(scale-a.scale))
	y := new(big.Int).Mul(b.int, pow10(scale-b.scale))
	return x.Cmp(y)
}

// canonical is a string equal for numerics PostgreSQL considers equal (1.0 = 1.00).
func (n numeric) canonical() string {
	if n.special != 0 {
		return n.text()
	}
	v := new(big.Int).Set(n.int)
	scale := n.scale
	ten := big.NewInt(10)
	m := new(big.Int)
	for scale > 0 {
		q, r := new(big.Int).QuoRem(v, ten, m)
		if r.Sign() != 0 {
			break
		}
		v = q
		scale--
	}
	return v.String() + "e-" + fmt.Sprint(scale)
}
