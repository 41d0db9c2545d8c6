package grant

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestFenceOfMatchesTheProbesFields(t *testing.T) {
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			writerPodAnnotation: "pod-1", serviceAccountsAnnotation: "pipeline", writerUserAnnotation: "u",
			repositoriesAnnotation: "acme/shop", writerRunAnnotation: "5005/1",
		}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("shop-41/uid-1"), LeaseTransitions: ptr.To(int32(7))},
	}
	want := Fence{Token: "7", Holder: "shop-41/uid-1", WriterPod: "pod-1", Accounts: "pipeline", Repositories: "acme/shop", WriterRun: "5005/1", WriterUser: "u"}
	if got := FenceOf(lease); got != want {
		t.Errorf("fenceOf = %+v, want %+v", got, want)
	}
	if got := FenceOf(&coordinationv1.Lease{}); got != (Fence{Token: "0", Repositories: "*"}) {
		t.Errorf("FenceOf(an empty Lease) = %+v, want token 0 and every repository, as buildlock-enforce says them", got)
	}
}
