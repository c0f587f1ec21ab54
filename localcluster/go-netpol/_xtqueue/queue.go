// Laid over expr/queue.go of github.com/google/nftables v0.3.0 (`go build -overlay`) to build
// pdwarden-network-policies-xtqueue, for kernels built without nftables' queue expression
// (CONFIG_NFT_QUEUE): a rule's `queue` is sent as the xtables NFQUEUE target (revision 3)
// through nft_compat instead, which hands the packet to the same nfnetlink queue with the same
// number and bypass flag, so kube-network-policies' verdicts apply unchanged. The types and
// constants are those of the file it replaces; reading a rule back decodes it as a Target.
// The local cluster starts this build only when the kernel refuses the queue expression, and
// says so.
//
// The directory's leading underscore keeps the go command from taking it for a package.

package expr

import (
	"encoding/binary"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type QueueAttribute uint16

type QueueFlag uint16

// Possible QueueAttribute values
const (
	QueueNum   QueueAttribute = unix.NFTA_QUEUE_NUM
	QueueTotal QueueAttribute = unix.NFTA_QUEUE_TOTAL
	QueueFlags QueueAttribute = unix.NFTA_QUEUE_FLAGS

	QueueFlagBypass QueueFlag = unix.NFT_QUEUE_FLAG_BYPASS
	QueueFlagFanout QueueFlag = unix.NFT_QUEUE_FLAG_CPU_FANOUT
	QueueFlagMask   QueueFlag = unix.NFT_QUEUE_FLAG_MASK
)

type Queue struct {
	Num   uint16
	Total uint16
	Flag  QueueFlag
}

func (e *Queue) target() *Target {
	if e.Total == 0 {
		e.Total = 1 // The total default value is 1
	}
	// struct xt_NFQ_info_v3 {queuenum, queues_total, flags} (host byte order), padded to
	// XT_ALIGN as iptables sends it. NFQ_FLAG_BYPASS and NFQ_FLAG_CPU_FANOUT have the values
	// of NFT_QUEUE_FLAG_BYPASS and NFT_QUEUE_FLAG_CPU_FANOUT.
	info := make(xt.Unknown, 8)
	copy(info[0:2], binaryutil.NativeEndian.PutUint16(e.Num))
	copy(info[2:4], binaryutil.NativeEndian.PutUint16(e.Total))
	copy(info[4:6], binaryutil.NativeEndian.PutUint16(uint16(e.Flag&QueueFlagMask)))
	return &Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}

func (e *Queue) marshal(fam byte) ([]byte, error) {
	return e.target().marshal(fam)
}

func (e *Queue) marshalData(fam byte) ([]byte, error) {
	return e.target().marshalData(fam)
}

func (e *Queue) unmarshal(fam byte, data []byte) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_QUEUE_NUM:
			e.Num = ad.Uint16()
		case unix.NFTA_QUEUE_TOTAL:
			e.Total = ad.Uint16()
		case unix.NFTA_QUEUE_FLAGS:
			e.Flag = QueueFlag(ad.Uint16())
		}
	}
	return ad.Err()
}
