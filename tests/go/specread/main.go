// specread decodes OCI runtime specs the way runc does (encoding/json into the runtime-spec
// shapes) and prints, for each, what runc sees of the parts accel-container-runtime decides
// from. Used by tests/go_differential.rs; standard library only, so it builds offline.
//
// Input: one spec per line on stdin. Output: one JSON line per spec, either {"err": "..."}
// (runc would refuse the spec) or the fields below.
//
// The structs follow github.com/opencontainers/runtime-spec/specs-go (config.go): the same
// field names, json tags and Go types, since the types decide what Go refuses (a number where
// a string belongs) and what it merges (a repeated object into the pointer it already holds).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
)

type Spec struct {
	Version     string            `json:"ociVersion"`
	Process     *Process          `json:"process,omitempty"`
	Root        *Root             `json:"root,omitempty"`
	Hostname    string            `json:"hostname,omitempty"`
	Mounts      []Mount           `json:"mounts,omitempty"`
	Hooks       *Hooks            `json:"hooks,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Linux       *Linux            `json:"linux,omitempty"`
}

type Process struct {
	Terminal     bool               `json:"terminal,omitempty"`
	User         User               `json:"user"`
	Args         []string           `json:"args,omitempty"`
	Env          []string           `json:"env,omitempty"`
	Cwd          string             `json:"cwd"`
	Capabilities *LinuxCapabilities `json:"capabilities,omitempty"`
}

type LinuxCapabilities struct {
	Bounding    []string `json:"bounding,omitempty"`
	Effective   []string `json:"effective,omitempty"`
	Inheritable []string `json:"inheritable,omitempty"`
	Permitted   []string `json:"permitted,omitempty"`
	Ambient     []string `json:"ambient,omitempty"`
}

type User struct {
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	Umask          *uint32  `json:"umask,omitempty"`
	AdditionalGids []uint32 `json:"additionalGids,omitempty"`
}

type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly,omitempty"`
}

type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type Hook struct {
	Path    string   `json:"path"`
	Args    []string `json:"args,omitempty"`
	Env     []string `json:"env,omitempty"`
	Timeout *int     `json:"timeout,omitempty"`
}

type Hooks struct {
	Prestart      []Hook `json:"prestart,omitempty"`
	CreateRuntime []Hook `json:"createRuntime,omitempty"`
	Poststop      []Hook `json:"poststop,omitempty"`
}

type Linux struct {
	Sysctl      map[string]string `json:"sysctl,omitempty"`
	Resources   *LinuxResources   `json:"resources,omitempty"`
	CgroupsPath string            `json:"cgroupsPath,omitempty"`
	Devices     []LinuxDevice     `json:"devices,omitempty"`
	MaskedPaths []string          `json:"maskedPaths,omitempty"`
}

type LinuxResources struct {
	Devices []LinuxDeviceCgroup `json:"devices,omitempty"`
}

type LinuxDevice struct {
	Path     string       `json:"path"`
	Type     string       `json:"type"`
	Major    int64        `json:"major"`
	Minor    int64        `json:"minor"`
	FileMode *os.FileMode `json:"fileMode,omitempty"`
	UID      *uint32      `json:"uid,omitempty"`
	GID      *uint32      `json:"gid,omitempty"`
}

type LinuxDeviceCgroup struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type,omitempty"`
	Major  *int64 `json:"major,omitempty"`
	Minor  *int64 `json:"minor,omitempty"`
	Access string `json:"access,omitempty"`
}

// Seen is what runc saw; absent sections are empty, as they are to runc's code.
type Seen struct {
	Err            string            `json:"err,omitempty"`
	Env            []string          `json:"env"`
	Bounding       []string          `json:"bounding"`
	AdditionalGids []uint32          `json:"additionalGids"`
	Annotations    map[string]string `json:"annotations"`
	Root           *string           `json:"root"`
	Mounts         []MountSeen       `json:"mounts"`
	Devices        []string          `json:"devices"`
	Rules          []Rule            `json:"rules"`
	Prestart       []string          `json:"prestart"`
}

// MountSeen is a Mount with every field written, empty or not.
type MountSeen struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options"`
}

type Rule struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"`
	Minor  *int64 `json:"minor"`
	Access string `json:"access"`
}

func strs(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func seen(line []byte) Seen {
	var spec *Spec
	// runc's loadSpec: json.NewDecoder(file).Decode(&spec).
	if err := json.NewDecoder(bytes.NewReader(line)).Decode(&spec); err != nil {
		return Seen{Err: err.Error()}
	}
	if spec == nil {
		return Seen{Err: "null spec"}
	}
	out := Seen{
		Env: []string{}, Bounding: []string{}, AdditionalGids: []uint32{},
		Annotations: map[string]string{}, Mounts: []MountSeen{}, Devices: []string{},
		Rules: []Rule{}, Prestart: []string{},
	}
	if p := spec.Process; p != nil {
		out.Env = strs(p.Env)
		if p.Capabilities != nil {
			out.Bounding = strs(p.Capabilities.Bounding)
		}
		if p.User.AdditionalGids != nil {
			out.AdditionalGids = p.User.AdditionalGids
		}
	}
	if spec.Annotations != nil {
		out.Annotations = spec.Annotations
	}
	if spec.Root != nil {
		out.Root = &spec.Root.Path
	}
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, MountSeen{m.Destination, m.Type, m.Source, strs(m.Options)})
	}
	if l := spec.Linux; l != nil {
		for _, d := range l.Devices {
			out.Devices = append(out.Devices, d.Path)
		}
		if l.Resources != nil {
			for _, r := range l.Resources.Devices {
				out.Rules = append(out.Rules, Rule{r.Allow, r.Type, r.Major, r.Minor, r.Access})
			}
		}
	}
	if spec.Hooks != nil {
		for _, h := range spec.Hooks.Prestart {
			out.Prestart = append(out.Prestart, h.Path)
		}
	}
	return out
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		if err := enc.Encode(seen(in.Bytes())); err != nil {
			panic(err)
		}
	}
	if err := in.Err(); err != nil {
		panic(err)
	}
	out.Flush()
}
