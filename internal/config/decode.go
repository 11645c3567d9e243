package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/v2"
)

// unmarshalConf decodes the merged layers into a Config. Keys match
// fields exactly (unknownKeys has named any other). Input stays weakly
// typed, for the environment and --set give every value as a string
// ("10" for an int, "true" for a bool, "a:1" for a list of one); the
// hooks refuse the conversions that would lose what the YAML file says
// (durationHook, scalarHook).
func unmarshalConf() koanf.UnmarshalConf {
	return koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: &mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.ComposeDecodeHookFunc(durationHook, scalarHook, mapstructure.TextUnmarshallerHookFunc()),
		WeaklyTypedInput: true,
		ErrorUnused:      true,
		MatchName:        func(key, field string) bool { return key == field },
	}}
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook reads a duration: text with a unit ("90s", "1h30m", or
// days, "7d", as koanf reads them), or 0. A number without a unit (3600 in
// YAML) would be nanoseconds, which no setting means: it is refused, as
// time.ParseDuration refuses "3600" from the environment.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType || from == durationType {
		return data, nil
	}
	v := reflect.ValueOf(data)
	switch from.Kind() {
	case reflect.String:
		s := v.String()
		d, err := ParseDuration(s)
		if err != nil {
			if _, nerr := strconv.ParseFloat(strings.TrimSpace(s), 64); nerr == nil {
				return nil, noUnit(s)
			}
			return nil, fmt.Errorf("%q is not a duration (e.g. 30s, 5m, 1h30m)", s)
		}
		return d, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		if v.IsZero() {
			return time.Duration(0), nil
		}
		return nil, noUnit(fmt.Sprint(data))
	case reflect.Bool:
		return nil, fmt.Errorf("%v is not a duration (e.g. 30s, 5m, 1h30m)", data)
	}
	return data, nil
}

// ParseDuration reads a duration as the configuration does: Go's units
// and "d" for 24 hours ("7d", "1d12h"); for flags that take a duration as
// text, so that a command line and a configuration file agree.
func ParseDuration(s string) (time.Duration, error) {
	return time.ParseDuration(expandDurationDays(s))
}

func noUnit(n string) error {
	return fmt.Errorf("%s has no unit: write one, e.g. %ss or %sm (units: ns, us, ms, s, m, h, d; 0 needs none)", n, n, n)
}

// dayDuration and expandDurationDays are koanf's (v2.4.1, MIT): the
// decoder it configures by default reads "d" as 24 hours.
var dayDuration = regexp.MustCompile(`(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)d`)

func expandDurationDays(s string) string {
	if strings.Contains(s, "d") {
		s = dayDuration.ReplaceAllStringFunc(s, func(day string) string {
			// Multiply the decimal by 24 without rounding or truncating
			// nanoseconds before parsing the actual duration.
			hours := []byte("00" + day[:len(day)-1])
			carry := 0
			for i := len(hours) - 1; i >= 0; i-- {
				if hours[i] == '.' {
					continue
				}
				n := int(hours[i]-'0')*24 + carry
				hours[i] = byte(n%10) + '0'
				carry = n / 10
			}
			return string(hours) + "h"
		})
	}
	return s
}

// scalarHook refuses what weak typing would silently make of a YAML value
// of another type than its setting's: a fraction for an integer (10.5
// would be 10), a number for a bool (1 would be true), a bool for a number
// or text (true would be 1, or "1"), a negative number for an unsigned
// one. Text (all the environment and --set give) is parsed as before:
// "10" for an integer, "true" for a bool.
func scalarHook(from, to reflect.Type, data any) (any, error) {
	if to == durationType || from == to {
		return data, nil
	}
	v := reflect.ValueOf(data)
	switch to.Kind() {
	case reflect.Bool:
		if from.Kind() != reflect.Bool && from.Kind() != reflect.String {
			return nil, fmt.Errorf("%v is not true or false", data)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		unsigned := to.Kind() >= reflect.Uint && to.Kind() <= reflect.Uint64
		switch from.Kind() {
		case reflect.Bool:
			return nil, fmt.Errorf("%v is not a number", data)
		case reflect.Float32, reflect.Float64:
			if f := v.Float(); f != math.Trunc(f) || math.Abs(f) >= 1<<63 {
				return nil, fmt.Errorf("%v is not a whole number", data)
			} else if unsigned && f < 0 {
				return nil, fmt.Errorf("%v is negative", data)
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			if unsigned && v.Int() < 0 {
				return nil, fmt.Errorf("%v is negative", data)
			}
		}
	case reflect.Float32, reflect.Float64:
		if from.Kind() == reflect.Bool {
			return nil, fmt.Errorf("%v is not a number", data)
		}
	case reflect.String:
		if from.Kind() == reflect.Bool {
			return nil, fmt.Errorf("%v is not text (quote it: \"%v\")", data, data)
		}
	}
	return data, nil
}

// decodeErrors renders the decoder's errors one a line as "key: what"
// (like Validate's), with where the key came from when it was the
// environment or --set.
func decodeErrors(err error, origin map[string]string) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		var de *mapstructure.DecodeError
		switch x := e.(type) {
		case *mapstructure.DecodeError:
			if errors.As(x.Unwrap(), &de) { // one of its fields: name that
				walk(x.Unwrap())
				return
			}
			msg := x.Name() + ": " + x.Unwrap().Error()
			if o, ok := origin[x.Name()]; ok {
				msg += " (from " + o + ")"
			}
			out = append(out, errors.New(msg))
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				walk(e)
			}
		default:
			if errors.As(e, &de) {
				walk(errors.Unwrap(e))
				return
			}
			out = append(out, e)
		}
	}
	walk(err)
	return errors.Join(out...)
}
